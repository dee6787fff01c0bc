"""Upstream drift radar: where does each patch stand against each upstream?

For every pinned base and for the newest ``keras-nightly`` sdist on PyPI,
each patch of every series is classified by content, not by name:

* ``applies``: ``git apply --check`` succeeds (the fix is still needed);
* ``upstream``: the reverse patch applies (upstream already has the change);
* ``conflict``: neither; the patch must be rebased.

With ``--proofs``, the proving tests of every fix run on the stock nightly
too (the single-process cells the matrix marks ``proven``): a fix whose
proofs pass there may have landed upstream by other means, even when its
patch no longer applies.

Exit status: 1 only when a patch conflicts with a base we ship (a nightly
conflict is news, not a failure).
"""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.errors import require_test_stack
from keras_fork.outputs import print_table
from keras_fork.recipe import patchfile
from keras_fork.recipe import pins
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe import series


def classify(tree: Path, patch: Path) -> str:
    """``applies``, ``upstream`` or ``conflict`` for ``patch`` on ``tree``.

    Test files the tree lacks are left out (see ``missing_tests``); the
    state then says so, e.g. ``applies (2 test files not in the sdist)``.
    """
    excludes = [f"--exclude={f}" for f in series.missing_tests(tree, patch)]

    def ok(*flags):
        patch_file = str(patch.resolve())
        proc = process.run_git(
            tree, "apply", "--check", *excludes, *flags, patch_file
        )
        return proc.returncode == 0

    if ok():
        state = "applies"
    elif ok("-R"):
        state = "upstream"
    else:
        state = "conflict"
    if excludes:
        state += f" ({len(excludes)} test files not in the sdist)"
    return state


def _unpack_any(archive: Path, dest: Path) -> Path:
    """Unpacks an sdist; returns its single top-level folder."""
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(dest, filter="data")
    (top,) = [p for p in dest.iterdir() if p.is_dir()]
    return top


def download_nightly(cache: Path) -> Path:
    """The newest ``keras-nightly`` sdist (unpinned: this is a radar).

    Raises:
        ForkError: the download failed (e.g. no network).
    """
    dest = cache / "nightly"
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.tar.gz"):
        old.unlink()
    proc = process.pip_download_sdist("keras-nightly", dest)
    found = sorted(dest.glob("*.tar.gz"))
    if proc.returncode != 0 or not found:
        raise ForkError(f"could not download keras-nightly:\n{proc.stderr}")
    return found[-1]


def check_series(tree: Path, patches: list[Path]) -> list[str]:
    """Classifies each patch on ``tree`` with the earlier ones applied.

    A series is cumulative: patch k is checked on the tree after patches
    1..k-1, each of which is applied when it ``applies`` (one already
    ``upstream`` is there anyway). ``tree`` is modified.

    Returns:
        One state per patch, in order.
    """
    states = []
    for patch in patches:
        state = classify(tree, patch)
        if state.startswith("applies"):
            absent = series.missing_tests(tree, patch)
            excludes = [f"--exclude={f}" for f in absent]
            process.git(tree, "apply", *excludes, str(patch.resolve()))
        states.append(state)
    return states


def radar(layout: pins.Layout, nightly: bool) -> list[dict]:
    """One row per (target, patch): target, shipped, series, patch, state,
    upstream (``patchfile.PatchInfo.upstream_status``).

    Each series is checked against its own base and the nightly; repo-only
    patches (files the sdist lacks) are reported, not checked.
    """
    bases = list(pins.load_bases(layout).values())
    nightly_target = None
    if nightly:
        archive = download_nightly(layout.cache)
        name = archive.name.removesuffix(".tar.gz").replace("_", "-")
        nightly_target = (name, archive, False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for b in bases:
            targets = [(b.version, sdist_lib.fetch(layout, b), True)]
            if nightly_target:
                targets.append(nightly_target)
            patches = series.read_series(layout, b)
            repo_only = series.read_repo_only(layout, b)
            upstream = {
                p: patchfile.parse_patch(p).upstream_status
                for p in patches + repo_only
            }
            for target, archive, shipped in targets:
                tree = _unpack_any(archive, Path(tmp) / f"{b.version}-{target}")
                states = check_series(tree, patches)
                states += ["n/a (repo-only: file not in the sdist)"] * len(
                    repo_only
                )
                names = patches + repo_only
                for patch, state in zip(names, states):
                    rows.append(
                        {
                            "target": target,
                            "shipped": shipped,
                            "series": b.version,
                            "patch": patch.name,
                            "state": state,
                            "upstream": upstream[patch],
                        }
                    )
    return rows


SINGLE_PROCESS = ("1",)


def nightly_proofs(layout: pins.Layout, archive: Path, console) -> list[dict]:
    """Runs the fixes' proving tests on the stock nightly ``archive``.

    Installs the sdist with ``pip install --no-deps --target`` under
    ``build/variants/nightly`` and runs, in a fresh process each, every
    single-device cell that the matrix marks ``proven``.

    Returns:
        One row per cell: ``fix``, ``backend``, ``topology``, ``outcome``
        (``fail`` = still needed, ``pass`` = may have landed, ``error``).

    Raises:
        ForkError: the nightly could not be installed.
    """
    from keras_fork.proof import cells as cells_lib
    from keras_fork.proof import runner
    from keras_fork.proof import variants

    name = archive.name.removesuffix(".tar.gz")
    version = name.split("-", 1)[1]
    keras_dir = variants.pip_install_target(
        layout.variant("nightly", name),
        [str(archive)],
        sdist_lib.sha256_of(archive),
        f"stock {name}",
    )
    from packaging.version import Version

    newest = max(pins.load_bases(layout), key=Version)
    cells = [
        c
        for c in cells_lib.load_matrix(layout.fixes)
        if c.base == newest
        and c.expect == "proven"
        and c.topology in SINGLE_PROCESS
    ]
    rows = []
    for cell in cells:
        console.print(f"  {name}: {cell.fix} on {cell.backend}/{cell.topology}")
        run = runner.run_variant(
            cell,
            "stock",
            keras_dir,
            version,
            layout.dist / "status" / f"{name}-{cell.slug}.xml",
            "cpu",
            900,
            layout,
        )
        rows.append(
            {
                "fix": cell.fix,
                "backend": cell.backend,
                "topology": cell.topology,
                "outcome": run["outcome"],
            }
        )
    return rows


def add_arguments(p) -> None:
    """The ``status`` verb's options."""
    p.add_argument(
        "--no-nightly",
        action="store_true",
        help="only the pinned bases (no download)",
    )
    p.add_argument(
        "--proofs",
        action="store_true",
        help="also run the fixes' proving tests on the stock nightly",
    )


def main(args, layout: pins.Layout) -> int:
    """``python -m keras_fork status``: the drift radar.

    Returns:
        1 when a patch of a shipped base conflicts with that base, else 0.

    Raises:
        ForkError: ``--proofs`` with ``--no-nightly`` or without the test
            stack; download, hash or series problems.
    """
    from rich.console import Console

    if args.proofs and args.no_nightly:
        raise ForkError("--proofs needs the nightly (drop --no-nightly)")
    if args.proofs:
        require_test_stack("status --proofs")
    console = Console(highlight=False)
    rows = radar(layout, nightly=not args.no_nightly)
    _print_radar(console, rows)
    if args.proofs:
        archive = sorted((layout.cache / "nightly").glob("*.tar.gz"))[-1]
        _print_proofs(console, nightly_proofs(layout, archive, console))
    # Our own bases: only the patches of that base's series count.
    bad = [
        r
        for r in rows
        if r["shipped"]
        and r["series"] == r["target"]
        and r["state"].startswith("conflict")
    ]
    return 1 if bad else 0


def _print_radar(console, rows: list[dict]) -> None:
    colors = {"applies": "green", "upstream": "cyan", "conflict": "bold red"}
    lines = [
        (
            r["target"],
            r["series"],
            r["patch"],
            f"[{colors.get(r['state'].split(' ')[0], 'dim')}]{r['state']}[/]",
            r.get("upstream", ""),
        )
        for r in rows
    ]
    columns = ("upstream", "series", "patch", "state", "upstream status")
    print_table("upstream drift radar", columns, lines, console)


def _print_proofs(console, proofs: list[dict]) -> None:
    meaning = {
        "fail": "still needed",
        "pass": "[cyan]may have landed: check upstream[/]",
        "error": "[red]could not run[/]",
    }
    lines = [
        (
            r["fix"],
            f"{r['backend']}/{r['topology']}",
            r["outcome"],
            meaning[r["outcome"]],
        )
        for r in proofs
    ]
    columns = ("fix", "cell", "stock nightly", "meaning")
    print_table("proving tests on the stock nightly", columns, lines, console)
