"""One line for the user on stderr, prefixed "imagegen:" (what a long step is doing, what was chosen
and why), flushed at once so that it shows before the work it announces."""
import sys


def say(line):
    print(f"imagegen: {line}", file=sys.stderr, flush=True)
