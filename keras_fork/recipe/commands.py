"""The recipe's verbs: ``build``, ``export`` and ``check``."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from keras_fork import options
from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe import series
from keras_fork.recipe import submission
from keras_fork.recipe import testswheel
from keras_fork.recipe import wheel


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def build_arguments(p) -> None:
    options.add_bases(p)
    options.add_sdist(p)


def export_arguments(p) -> None:
    options.add_base(p, "the base to export")


def check_arguments(p) -> None:
    options.add_bases(p)
    p.add_argument(
        "--upstream-git",
        type=Path,
        help="a keras-team/keras clone: also apply patches/<V>/repo-only "
        "to its tag v<V>",
    )


def build(args, layout: pins.Layout) -> int:
    """The wheel of each selected base into ``dist/`` (the PR series is
    the ``pr-series`` verb's).

    Every base's sdist is checked (present, sha256, version) before any
    output changes; each base's wheel is built in a staging folder under
    ``build/`` and moved into place only when whole, so a failed build
    leaves the previous ones byte-identical.

    Raises:
        ForkError: an unknown base, ``--sdist`` with several bases, a bad
            sdist (``sdist.fetch``), a series out of canonical form, or a
            master PR that does not apply alone (``submission.checked_tree``).
    """
    bases = sdist_lib.fetch_selected(layout, args.base, args.sdist)
    _remove_scratch(layout)
    console = _console()
    for base in bases:
        whl = _build_base(layout, base, console)
        console.print(f"[green]built[/] {whl.relative_to(layout.root)}")
    tests = testswheel.build(layout)
    console.print(f"[green]built[/] {tests.relative_to(layout.root)}")
    return 0


def _remove_scratch(layout: pins.Layout) -> None:
    """Removes the scratch folders of a build that was killed (no cleanup
    ran)."""
    for scratch in [
        *layout.build.glob(".wheel.*"),
        *layout.build.glob("trees/.*"),
        *layout.build.glob(".stage.*"),
        *layout.build.glob(".testswheel.*"),
    ]:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_base(layout: pins.Layout, base: pins.Base, console) -> Path:
    """Materializes and checks ``base``'s tree (``submission.checked_tree``),
    builds its wheel in a staging folder, then publishes it.

    Returns:
        The wheel in ``dist/``.
    """
    with console.status(f"keras {base.version}: materializing"):
        tree = submission.checked_tree(layout, base)
    # Staged under build/, on dist/'s file system (both in the checkout):
    # the move into dist/ is a rename, and a killed build leaves nothing
    # in dist/.
    layout.build.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=layout.build, prefix=".stage.") as t:
        with console.status(f"keras {base.version}: building the wheel"):
            whl = wheel.build(layout, base, tree, outdir=Path(t))
        return _publish(layout, base, whl)


def _publish(layout: pins.Layout, base: pins.Base, whl: Path) -> Path:
    """Moves a base's staged wheel into ``dist/``, replacing the previous
    one (a wheel of another fork build number of the base included).

    Returns:
        The wheel in ``dist/``.
    """
    final = layout.dist / whl.name
    for old in layout.dist.glob(f"keras-{base.version}+fork.*.whl"):
        if old != final:
            old.unlink()
    os.replace(whl, final)
    return final


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
