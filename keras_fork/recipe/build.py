"""The ``build`` verb: the fork wheel of each selected base into ``dist/``,
and the tests wheel (the PR series is the ``pr-series`` verb's)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from keras_fork import options
from keras_fork.recipe import pins
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe import submission
from keras_fork.recipe import testswheel
from keras_fork.recipe import wheel


def add_arguments(p) -> None:
    """The ``build`` verb's options."""
    options.add_bases(p)
    options.add_sdist(p)


def main(args, layout: pins.Layout) -> int:
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
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
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
