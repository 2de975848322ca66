"""The format tag of what imagegen saves: a run checkpoint's "format" key and a shipped model's .json.

A leaf: checkpoint.py, checks.py and shipped.py all import it, and it imports nothing."""
FORMAT = "imagegen/1"
