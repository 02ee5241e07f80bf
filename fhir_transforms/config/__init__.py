"""What a user configures is data, never a program: the files they name (regular files, size-capped), YAML with
no aliases and a bounded depth, and FHIRPath conditions from an allowed subset, evaluated under a budget."""
