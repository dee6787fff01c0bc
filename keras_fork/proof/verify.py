"""``python -m keras_fork verify``: the fix tests against whichever keras
this interpreter imports, on every topology this machine can form.

The runner lives in the test package (``integration_tests.harness.verify``,
shipped in the tests wheel as ``python -m keras_fork_tests``), so that
a user without this repository runs the same thing; this verb only
hands it the command line.
"""

from __future__ import annotations

from integration_tests.harness import verify


def add_arguments(p) -> None:
    """``verify``'s options (``harness.verify.add_arguments``)."""
    verify.add_arguments(p)


def main(args, layout) -> int:
    """Runs ``verify`` (``harness.verify.run_verify``); ``layout`` is not
    used: the fix tests are the package's own.

    Returns:
        0 when no applicable cell is broken, 1 when one is, 2 for a bad
        argument or no keras to verify.
    """
    del layout
    return verify.run_verify(args)
