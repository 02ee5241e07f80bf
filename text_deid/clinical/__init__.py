"""What clinical values look like: check digits of code systems, and the filter that keeps them unmasked."""
