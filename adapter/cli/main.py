"""`deid-adapter`: the command line. Exit 0 ok, 2 bad usage or input, 3 refused (../shared/DESIGN.md).

Each command lives in a module of its own, imported only when that command runs, so `--help` and a wrong
argument answer without loading the engines, the text stack or the web frameworks."""
from __future__ import annotations

import ast
import importlib
from functools import lru_cache
from pathlib import Path

import click
import typer
from typer.core import TyperGroup

from adapter.cli.common import EXIT_CODES, fail, tune_gc

# Command name → (module, attribute): a command function, or a Typer app of subcommands. In --help order.
COMMANDS = {
    "fhir": ("adapter.cli.fhir", "fhir"),
    "eval": ("adapter.cli.text", "eval_"),
    "hl7": ("adapter.cli.hl7", "hl7"),
    "mllp": ("adapter.cli.mllp", "mllp_app"),
    "serve": ("adapter.cli.serve", "serve"),
    "bulk": ("adapter.cli.bulk", "bulk"),
    "risk": ("adapter.cli.risk", "risk_command"),
    "keys": ("adapter.cli.audit", "keys_app"),
    "text": ("adapter.cli.text", "text_app"),
    "tokens": ("adapter.cli.serve", "tokens_app"),
    "conformance": ("adapter.cli.serve", "conformance_app"),
    "audit": ("adapter.cli.audit", "audit_app"),
    "vault": ("adapter.cli.audit", "vault_app"),
    "review": ("adapter.cli.review", "review_app"),
    "rules": ("adapter.cli.rules", "rules_app"),
}


@lru_cache(maxsize=None)
def _help_text(module: str, attr: str) -> str:
    """A command's help as its module's source states it (docstring, or the Typer app's help=), read without
    importing the module."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attr:
            return ast.get_docstring(node) or ""
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == attr for t in node.targets):
            return next((ast.literal_eval(k.value) for k in node.value.keywords if k.arg == "help"), "")
    return ""


class LazyCommands(TyperGroup):
    """A group whose commands are imported when one of them runs; listing them (--help) imports none."""

    listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        if self.listing:
            return click.Command(name, help=_help_text(module, attr))
        target = getattr(importlib.import_module(module), attr)
        if isinstance(target, typer.Typer):
            group = typer.main.get_group(target)
            group.name = name
            return group
        single = typer.Typer(add_completion=False)
        single.command(name)(target)
        return typer.main.get_command(single)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except tuple(EXIT_CODES) as e:  # an error no command handled itself: its message and its exit code
            fail(str(e), next(code for kind, code in EXIT_CODES.items() if isinstance(e, kind)))

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = typer.Typer(cls=LazyCommands, help="De-identify FHIR R4 and HL7v2 under HIPAA Safe Harbor, with keyed pseudonyms.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.callback()
def _process_settings() -> None:
    tune_gc()


def main() -> None:
    """The `deid-adapter` entry point."""
    app()


if __name__ == "__main__":
    main()
