"""Options that many commands share, defined once (the command modules import them from here)."""
import typer

from fhir_transforms import keys

KeyFile = typer.Option(None, "--key-file", envvar=keys.KEY_FILE_ENV, help="Key file (or DEID_ADAPTER_KEY_FILE).",
                       show_envvar=True)
StackOpt = typer.Option(None, "--stack", help="Text stack: patterns, no-llm, precision-first, recall-first, balanced.")
LlmUrl = typer.Option(None, "--llm-url", envvar="DEID_ADAPTER_LLM_URL", help="Ollama endpoint for the LLM stacks.")
LlmModel = typer.Option(None, "--llm-model", envvar="DEID_ADAPTER_LLM_MODEL", help="Ollama model for the LLM stacks.")
