"""`python -m adapter.cli.main`: the same as the `deid-adapter` command."""
from adapter.cli.main import main

main()
