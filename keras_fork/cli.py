"""The one command line: ``python -m keras_fork <verb>`` (``--help`` on each).

Verbs (the ``scripts/`` entry points call these):
  build    materialize each base, check the series, build the wheel into
           dist/                                         (recipe)
  export   rewrite patches/<base>/ from the materialized tree (recipe)
  check    fail when re-exporting the materialized tree changes patches/
  rebase   move a base's series onto another pinned base (git rebase)
  prove    run the stock-vs-fork proof matrix            (proof)
  verify   the fix tests against the installed keras, on this machine's
           devices (the tests wheel's runner)
  bisect   every shorter prefix of each series builds and passes its tests
  fixes    the fix catalog: bases, issue, upstream status, cells, patches
  timings  where the last scripts/test run's time went (dist/timings.json)
  bench    fork/stock step time, shuffle cost, work per step (bench)
  bench-matrix  the matrix's wall time: per cell, no gc.freeze, grouped
  status   each series against its base and the newest keras-nightly
  regressions  upstream's own unit tests, stock vs fork, test by test
  pr-check each PR alone on a Keras git checkout: applies, its tests fail
           on the checkout's code and pass with the PR
  pr-tests rewrite a nightly series' test hunks to apply alone on a checkout
  pr-series  the PR series into dist/pr-series/<V>/, with the proof and
           pr-check rows where dist/ has them            (upstream)

A verb's module gives ``add_arguments(parser)`` and ``main(args, layout)``;
``main`` returns the exit status. Only the chosen verb's module is imported,
so each verb needs only what its own environment installs: every verb's
``--help``, and every verb but ``TEST_STACK_VERBS``, run with
``requirements/build.txt`` alone; those verbs (and ``status --proofs``)
need ``requirements/test.txt`` and, without it, say so in one line and exit
with 2 (``errors.require_test_stack``). Bad input raises ``ForkError``: the
message is printed without a traceback and the exit status is 2 (as for a
usage error); outputs are written whole or not at all (``keras_fork.outputs``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from keras_fork.errors import ForkError
from keras_fork.errors import require_test_stack
from keras_fork.recipe import pins

# verb -> (its module, with add_arguments and main; one-line help)
VERBS = {
    "build": ("keras_fork.recipe.build", "wheels into dist/"),
    "export": ("keras_fork.recipe.export", "rewrite patches/<V> from the tree"),
    "check": ("keras_fork.recipe.check", "re-export must reproduce patches/"),
    "rebase": ("keras_fork.recipe.rebase", "move a series onto a new base"),
    "prove": ("keras_fork.proof.prove", "run the stock-vs-fork proof matrix"),
    "verify": (
        "keras_fork.proof.verify",
        "the fix tests against the installed keras",
    ),
    "equivalence": (
        "keras_fork.proof.equivalence",
        "each feature under each topology against one device",
    ),
    "bisect": ("keras_fork.proof.bisect", "every series prefix builds, passes"),
    "fixes": ("keras_fork.proof.fixes", "the fix catalog and its cells"),
    "timings": ("keras_fork.proof.timings", "where a test run's time went"),
    "bench": ("keras_fork.bench.bench", "fork/stock step time and work"),
    "bench-matrix": (
        "keras_fork.bench.matrix",
        "matrix time: per cell, no gc.freeze, grouped",
    ),
    "status": ("keras_fork.upstream.status", "each series against upstream"),
    "regressions": (
        "keras_fork.upstream.regressions",
        "upstream's unit tests, stock vs fork",
    ),
    "pr-check": ("keras_fork.upstream.prcheck", "each PR alone on a checkout"),
    "pr-tests": (
        "keras_fork.upstream.prtests",
        "test hunks that apply alone on a checkout",
    ),
    "pr-series": (
        "keras_fork.upstream.prseries",
        "PR series into dist/pr-series/<V>/, with the proof",
    ),
}
# The verbs that run Keras (its tests, the fixes' tests, the benchmarks):
# checked for requirements/test.txt before they start.
TEST_STACK_VERBS = frozenset(
    {
        "prove",
        "equivalence",
        "bisect",
        "bench",
        "bench-matrix",
        "regressions",
        "pr-check",
    }
)


def _handlers(verb: str, module_name: str):
    """``(add_arguments, main)`` of a verb: its module's."""
    module = importlib.import_module(module_name)
    return module.add_arguments, module.main


def chosen_verb(argv: list[str]) -> str | None:
    """The verb named in ``argv``: its first word that is a verb, or None
    (``--help`` alone, a usage error)."""
    return next((word for word in argv if word in VERBS), None)


def parser(verbs=None) -> argparse.ArgumentParser:
    """The command line: one subparser a verb.

    Args:
        verbs: the verbs whose modules are imported to add their options
            (default: every verb). The others are listed with their help
            line only, so that ``python -m keras_fork build`` imports the
            recipe alone and runs with ``requirements/build.txt`` alone.
    """
    p = argparse.ArgumentParser(
        prog="python -m keras_fork",
        description="Keras fork: recipe, proof, benchmarks, upstream status.",
    )
    p.add_argument(
        "--root", type=Path, default=pins.CODE_ROOT, help=argparse.SUPPRESS
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="<verb>")
    for verb, (module, help_text) in VERBS.items():
        vp = sub.add_parser(verb, help=help_text, description=help_text)
        if verbs is None or verb in verbs:
            add_arguments, run = _handlers(verb, module)
            add_arguments(vp)
            vp.set_defaults(func=run)
    return p


def main(argv=None) -> int:
    """Parses ``argv`` (default ``sys.argv[1:]``) and runs the verb.

    Returns:
        The verb's exit status; 2 for bad input (``ForkError``, or a usage
        error from argparse, which exits itself) and for a verb of
        ``TEST_STACK_VERBS`` without the test stack.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser({chosen_verb(argv)}).parse_args(argv)
    layout = pins.Layout.default(args.root)
    try:
        if args.verb in TEST_STACK_VERBS:
            require_test_stack(args.verb)
        return args.func(args, layout)
    except ForkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
