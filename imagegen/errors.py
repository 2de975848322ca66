"""One exception type for problems a user can fix; entry points print it as one line."""


class UserError(Exception):
    """A problem with the user's input (data, config, checkpoint), phrased as what is wrong and how to fix it."""
