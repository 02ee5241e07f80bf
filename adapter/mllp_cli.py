"""`deid-adapter mllp`: being written (issue: MLLP listener)."""
import typer


def mllp() -> None:
    """MLLP listener (not built yet)."""
    typer.echo("deid-adapter: mllp is not built yet", err=True)
    raise typer.Exit(2)
