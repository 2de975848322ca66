"""One exception type for problems a user can fix; entry points print it as one line."""


def printable(text):
    """text with every character that is not printable (newline, tab, escape, bidi controls, ...)
    written as its Python escape (\\n, \\t, \\x1b, \\u202e): text read from a file (a pickle's class
    name, a key, a folder's name) can then neither break a message's one line nor drive the terminal."""
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class UserError(Exception):
    """A problem with the user's input (data, config, checkpoint), phrased as what is wrong and how to fix it.
    Its message is one line whatever went into it: the characters that are not printable are escaped
    (`printable`), so that text read from a file reaches the message escaped."""

    def __init__(self, *args):
        super().__init__(*(printable(a) if isinstance(a, str) else a for a in args))


def one_line(main):
    """main() as a script's entry point: a UserError ends it with its one line on stderr (exit 1)."""
    def run(*args, **kwargs):
        import sys
        try:
            return main(*args, **kwargs)
        except UserError as e:
            sys.exit(f"error: {e}")
    return run
