"""The MLLP edge: the listener between interface engines and its durable queue."""
