"""The recipe's verbs: ``build``, ``export`` and ``check``."""

from __future__ import annotations

import shutil
from pathlib import Path

from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe import prseries
from keras_fork.recipe import series
from keras_fork.recipe import wheel


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def build_arguments(p) -> None:
    p.add_argument("--base", action="append", help="base version (repeat)")
    p.add_argument("--sdist", type=Path, help="use this sdist (offline)")


def export_arguments(p) -> None:
    p.add_argument("--base", required=True)


def check_arguments(p) -> None:
    p.add_argument("--base", action="append")
    p.add_argument(
        "--upstream-git",
        type=Path,
        help="a keras-team/keras clone: also apply patches/<V>/repo-only "
        "to its tag v<V>",
    )


def build(args, layout: pins.Layout) -> int:
    """Wheels and PR series of each selected base into ``dist/``."""
    bases = pins.select_bases(layout, args.base)
    if args.sdist and len(bases) != 1:
        raise ForkError("--sdist needs exactly one --base")
    console = _console()
    # Scratch folders of a build that was killed (no cleanup ran).
    for scratch in [
        *layout.build.glob(".wheel.*"),
        *layout.build.glob("trees/.*"),
        *layout.dist.glob("pr-series/.pr.*"),
    ]:
        shutil.rmtree(scratch, ignore_errors=True)
    for base in bases:
        # Outputs of an earlier build (any fork build number of this base)
        # must not survive a failed one.
        for old in layout.dist.glob(f"keras-{base.version}+fork.*.whl"):
            old.unlink()
        stale = prseries.pr_series_dir(layout, base)
        if stale.exists():
            shutil.rmtree(stale)
        with console.status(f"keras {base.version}: materializing"):
            tree = series.materialize(layout, base, args.sdist)
        drift = series.check(layout, base, tree)
        if drift:
            raise ForkError(
                f"re-exporting the {base.version} tree changes {drift}: "
                f"patches/{base.version} is not in canonical form; run "
                f"`python -m keras_fork export --base {base.version}`"
            )
        if base.package == "keras-nightly":  # master: PRs go in one by one
            alone = series.not_alone(tree, series.read_series(layout, base))
            if alone:
                raise ForkError(
                    f"PRs of the master series {base.version} that do not "
                    "apply alone on master (make each stand alone, or fold "
                    "it into the PR it needs):\n  " + "\n  ".join(alone)
                )
        with console.status(f"keras {base.version}: building the wheel"):
            whl = wheel.build(layout, base, tree)
        pr = prseries.write(layout, base, tree)
        console.print(f"[green]built[/] {whl.relative_to(layout.root)}")
        console.print(f"[green]wrote[/] {pr.relative_to(layout.root)}/")
    return 0


def export(args, layout: pins.Layout) -> int:
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
    console = _console()
    console.print(f"exported {len(names)} patches to patches/{base.version}")
    if carry:
        for name in sorted(set(names) - before):
            console.print(
                f"[yellow]{name}[/]: new or renamed, so it has no test hunks "
                f"(base {base.version}'s tree has no test files): add them "
                "from a Keras git checkout (docs/upstream.md)"
            )
    return 0


def check(args, layout: pins.Layout) -> int:
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
