"""`python -m adapter.cli`: the same as the `deid-adapter` command."""
from adapter.cli.main import main

main()
