"""Edges of deid-adapter: CLI, files, HTTP, MLLP and bulk. They only translate to and from the one flow."""
