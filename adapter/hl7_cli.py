"""`deid-adapter hl7`: being written (issue: HL7v2 through the same engine)."""
import typer


def hl7(input: str = typer.Argument(...), output: str = typer.Argument(...)) -> None:
    """De-identify HL7v2 ER7 messages (not built yet)."""
    typer.echo("deid-adapter: hl7 is not built yet", err=True)
    raise typer.Exit(2)
