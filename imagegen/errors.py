"""One exception type for problems a user can fix; entry points print it as one line."""


class UserError(Exception):
    """A problem with the user's input (data, config, checkpoint), phrased as what is wrong and how to fix it."""


def one_line(main):
    """main() as a script's entry point: a UserError ends it with its one line on stderr (exit 1)."""
    def run(*args, **kwargs):
        import sys
        try:
            return main(*args, **kwargs)
        except UserError as e:
            sys.exit(f"error: {e}")
    return run
