"""The one error type the tooling raises for bad input, and the checks
that raise it alike in every verb."""

from __future__ import annotations

import importlib.util


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


# What requirements/test.txt adds that a verb running Keras needs whatever
# it selects (``filelock``: the variant installs), and the backends, of
# which it needs one (a GPU runner may lack TensorFlow, docs/gpu.md).
TEST_STACK = ("filelock", "numpy")
BACKENDS = ("jax", "tensorflow", "torch")


def _importable(name: str) -> bool:
    """Whether top-level module ``name`` can be imported (not importing
    it: TensorFlow takes seconds)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it
        return False


def require_test_stack(what: str) -> None:
    """Refuses ``what`` (a verb, e.g. ``prove``) in an environment made
    from requirements/build.txt alone, before it starts.

    Raises:
        ForkError: ``prove needs the test environment (missing: filelock,
            numpy, a backend: jax, tensorflow or torch): pip install -c
            constraints.txt -r requirements/test.txt (scripts/test,
            scripts/prove and scripts/bench install it into .venv)``.
    """
    missing = [name for name in TEST_STACK if not _importable(name)]
    if not any(map(_importable, BACKENDS)):
        *others, last = BACKENDS
        missing.append(f"a backend: {', '.join(others)} or {last}")
    if missing:
        raise ForkError(
            f"{what} needs the test environment (missing: "
            f"{', '.join(missing)}): pip install -c constraints.txt -r "
            "requirements/test.txt (scripts/test, scripts/prove and "
            "scripts/bench install it into .venv)"
        )
