"""The format tag of what imagegen saves (a run checkpoint's "format" key and a shipped model's .json),
and the sentence for a file of ours that is damaged.

A leaf: checkpoint.py, checks.py and shipped.py all import it, and it imports only errors."""
from ..errors import UserError

FORMAT = "imagegen/1"


def damaged(path, what):
    return UserError(f"{path} is damaged or was edited: {what}; use another checkpoint, e.g. best.pt or last.pt "
                     f"from the run folder.")
