"""What imagegen prints for the user. `show` prints lines (stdout), each escaped by errors.printable: a name
read from the disk or the command line (a file, a folder, a class, a config string) holding an escape code, a
newline or a carriage return is shown escaped, so it can neither drive the terminal nor break a line or a
table. Every printer goes through it: `say` (one line on stderr, prefixed "imagegen:": what a long step is
doing, what was chosen and why, flushed at once so that it shows before the work it announces, on a line of
its own even while a progress bar is drawn, `apart_from_bars`), the commands' reports and tables, and the
one-line errors (UserError escapes its message the same way). `wrapped` folds a longer sentence into lines a
terminal shows whole."""
import contextlib
import sys
import textwrap

from .errors import printable

WIDTH = 100


def show(*lines, file=None, wrap=False):
    """Print each of lines on a line of its own, escaped (errors.printable); wrap: folded by `wrapped` after
    escaping. file: stdout unless given."""
    for line in lines:
        line = printable(line)
        print(wrapped(line) if wrap else line, file=file or sys.stdout, flush=True)


def say(line):
    with apart_from_bars():
        show(f"imagegen: {line}", file=sys.stderr)


def apart_from_bars():
    """A context for writing to stderr while a tqdm progress bar may be drawn there: the bars are cleared
    before and drawn again after, so the text starts a line of its own instead of following the bar's
    (the kernel's fallback line, said from inside the sampling loop, read "sampling: 0%| | 0/28imagegen: ...").
    Nothing to do where tqdm was never imported: there is no bar."""
    tqdm = sys.modules.get("tqdm")
    return tqdm.tqdm.external_write_mode(file=sys.stderr) if tqdm else contextlib.nullcontext()


def wrapped(text, width=WIDTH):
    """text folded into lines of at most `width` characters (a word longer than that, a path, stays whole),
    the lines after the first indented by two spaces."""
    return textwrap.fill(text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
