"""The one error type the tooling raises for bad input."""


class ForkError(Exception):
    """A user-facing failure: the message says what is wrong and how to fix it.

    The command line prints the message (no traceback) and exits with 2.
    """
