"""One line for the user on stderr, prefixed "imagegen:" (what a long step is doing, what was chosen
and why), flushed at once so that it shows before the work it announces; `wrapped` folds a longer sentence into
lines a terminal shows whole."""
import sys
import textwrap

WIDTH = 100


def say(line):
    print(f"imagegen: {line}", file=sys.stderr, flush=True)


def wrapped(text, width=WIDTH):
    """text folded into lines of at most `width` characters (a word longer than that, a path, stays whole),
    the lines after the first indented by two spaces."""
    return textwrap.fill(text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
