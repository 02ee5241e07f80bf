"""`python -m adapter.cli`: the same as the `deid-adapter` command. Also the file `spark-submit` runs:
`spark-submit adapter/cli/__main__.py bulk IN OUT --engine spark …` (see docs/bulk.md)."""
from adapter.cli.main import main

main()
