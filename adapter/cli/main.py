"""`deid-adapter`: the command line. Exit 0 ok, 2 bad usage or input, 3 refused (../shared/DESIGN.md).
Each command lives in a module of its own; this one only registers them."""
from __future__ import annotations

import typer

from adapter.cli import audit, bulk, fhir, hl7, keys, mllp, review, risk, serve, text
from adapter.cli.common import tune_gc

app = typer.Typer(help="De-identify FHIR R4 and HL7v2 under HIPAA Safe Harbor, with keyed pseudonyms.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.callback()
def _process_settings() -> None:
    tune_gc()


app.command("fhir")(fhir.fhir)
app.command("eval")(text.eval_)
app.command("hl7")(hl7.hl7)
app.command("mllp")(mllp.mllp)
app.command("serve")(serve.serve)
app.command("bulk")(bulk.bulk)
app.command("risk")(risk.risk_command)
app.add_typer(keys.keys_app, name="keys")
app.add_typer(text.text_app, name="text")
app.add_typer(serve.tokens_app, name="tokens")
app.add_typer(serve.conformance_app, name="conformance")
app.add_typer(audit.audit_app, name="audit")
app.add_typer(audit.vault_app, name="vault")
app.add_typer(review.review_app, name="review")


def main() -> None:
    """The `deid-adapter` entry point."""
    app()


if __name__ == "__main__":
    main()
