"""The one error type the tooling raises for bad input."""


class ForkError(Exception):
    """A user-facing failure: the message says what is wrong and how to fix it.

    The command line prints the message (no traceback) and exits with 2.
    """


def check_known(option: str, given, valid) -> None:
    """The one style for a bad filter value, in every verb: each unknown
    value of ``option`` is named, with the valid ones.

    Args:
        option: the option as typed, e.g. ``--fix``.
        given: the values given (None or empty: nothing to check).
        valid: every value the option accepts.

    Raises:
        ForkError: ``unknown --fix 'nosuch'; valid: a, b, c``.
    """
    unknown = [v for v in given or () if v not in valid]
    if unknown:
        names = sorted(valid)
        if any(" " in v or "," in v for v in names):  # e.g. bench cases
            names = list(map(repr, names))
        raise ForkError(
            f"unknown {option} {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(names)}"
        )
