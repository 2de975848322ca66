"""The format tag of what imagegen saves (a run checkpoint's "format" key and a shipped model's .json),
and the sentence for a file of ours that is damaged: what is wrong, then what to do, which the command
that read the file knows best (`advice`).

A leaf: checkpoint.py, checks.py and shipped.py all import it, and it imports only errors."""
from contextlib import contextmanager

from ..errors import UserError

FORMAT = "imagegen/1"
MAX_WEIGHT = 2.0 ** 64     # |weight| beyond this is out of range: its square overflows float32
FIX = "use another checkpoint, e.g. best.pt or last.pt from the run folder"   # a command that takes checkpoint=


class Damaged(UserError):
    """A file of ours that cannot be used: `head` says which and why, `fix` what to do (the reader's
    command's own step, given by `advice`)."""

    def __init__(self, head, fix=FIX):
        super().__init__(f"{head}; {fix}.")
        self.head = head


def damaged(path, what):
    return Damaged(f"{path} is damaged or was edited: {what}")


@contextmanager
def advice(fix):
    """Within it, a Damaged error ends with `fix` (what to do, in the words of the command reading the file)."""
    try:
        yield
    except Damaged as e:
        raise Damaged(e.head, fix) from None
