"""The ``check`` verb: each selected base's tree materialized afresh must
re-export to ``patches/<V>/`` exactly (canonical form)."""

from __future__ import annotations

from pathlib import Path

from keras_fork import options
from keras_fork.recipe import pins
from keras_fork.recipe import series


def add_arguments(p) -> None:
    """The ``check`` verb's options."""
    options.add_bases(p)
    p.add_argument(
        "--upstream-git",
        type=Path,
        help="a keras-team/keras clone: also apply patches/<V>/repo-only "
        "to its tag v<V>",
    )


def main(args, layout: pins.Layout) -> int:
    """1 when re-exporting a base's tree changes ``patches/<V>``."""
    status = 0
    for base in pins.select_bases(layout, args.base):
        tree = series.materialize(layout, base, None)
        drift = series.check(layout, base, tree)
        if drift:
            print(f"{base.version}: re-export differs in {drift}")
            status = 1
        else:
            print(f"{base.version}: re-export reproduces patches/ exactly")
        if args.upstream_git:
            failed = series.check_repo_only(layout, base, args.upstream_git)
            for line in failed:
                print(f"{base.version}: repo-only patch does not apply: {line}")
            status = status or int(bool(failed))
            if not failed:
                n = len(series.read_repo_only(layout, base))
                print(
                    f"{base.version}: {n} repo-only patch(es) apply to "
                    f"v{base.version} of {args.upstream_git}"
                )
    return status
