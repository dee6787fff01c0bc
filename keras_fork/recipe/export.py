"""The ``export`` verb: ``patches/<V>/`` rewritten from the materialized
tree (after a commit in it was edited, added or removed)."""

from __future__ import annotations

from keras_fork import options
from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe import series


def add_arguments(p) -> None:
    """The ``export`` verb's options."""
    options.add_base(p, "the base to export")


def main(args, layout: pins.Layout) -> int:
    """Rewrites ``patches/<V>/`` from the materialized tree."""
    base = pins.get_base(layout, args.base)
    tree = layout.tree(base.version)
    if not (tree / ".git").is_dir():
        raise ForkError(f"no materialized tree at {tree}: run scripts/build")
    folder = series.series_dir(layout, base)
    before = set()
    if (folder / series.ORDER_FILE).is_file():
        before = {p.name for p in series.read_series(layout, base)}
    # A tree without test files: each patch keeps its old file's test hunks.
    carry = not base.sdist_tests
    names = series.export(tree, folder, carry_tests=carry)
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    console.print(f"exported {len(names)} patches to patches/{base.version}")
    if carry:
        for name in sorted(set(names) - before):
            console.print(
                f"[yellow]{name}[/]: new or renamed, so it has no test hunks "
                f"(base {base.version}'s tree has no test files): add them "
                "from a Keras git checkout (docs/upstream.md)"
            )
    return 0
