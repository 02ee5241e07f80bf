"""Training the project's default clinical NER model from synthetic notes (see `train.py`)."""
