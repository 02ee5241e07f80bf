"""Command line: one module per command, `common` for what they share, `main` registers them."""
