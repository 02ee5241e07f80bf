"""The review edge: a web page where people check the spans the stack was unsure of."""
