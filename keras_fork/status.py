"""Upstream drift radar: where does each patch stand against each upstream?

For every pinned base and for the newest ``keras-nightly`` sdist on PyPI,
each patch of every series is classified by content, not by name:

* ``applies``: ``git apply --check`` succeeds (the fix is still needed);
* ``upstream``: the reverse patch applies (upstream already has the change);
* ``conflict``: neither; the patch must be rebased.

Exit status: 1 only when a patch conflicts with a base we ship (a nightly
conflict is news, not a failure).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from keras_fork import pins
from keras_fork import sdist as sdist_lib
from keras_fork import series
from keras_fork.errors import ForkError


def classify(tree: Path, patch: Path) -> str:
    """``applies``, ``upstream`` or ``conflict`` for ``patch`` on ``tree``."""

    def ok(*flags):
        proc = subprocess.run(
            ["git", "apply", "--check", *flags, str(patch.resolve())],
            cwd=tree,
            capture_output=True,
        )
        return proc.returncode == 0

    if ok():
        return "applies"
    if ok("-R"):
        return "upstream"
    return "conflict"


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
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
         "--no-binary", ":all:", "--no-build-isolation",
         "--disable-pip-version-check", "-d", str(dest), "keras-nightly"],
        capture_output=True, text=True,
    )  # fmt: skip
    found = sorted(dest.glob("*.tar.gz"))
    if proc.returncode != 0 or not found:
        raise ForkError(f"could not download keras-nightly:\n{proc.stderr}")
    return found[-1]


def radar(layout: pins.Layout, nightly: bool) -> list[dict]:
    """One row per (target, patch): target, shipped, series, patch, state."""
    bases = list(pins.load_bases(layout).values())
    patches = [(b.version, p) for b in bases for p in series.read_series(
        layout, b)]  # fmt: skip
    patches += [
        (b.version, p) for b in bases for p in series.read_repo_only(layout, b)
    ]
    targets = [(b.version, sdist_lib.fetch(layout, b), True) for b in bases]
    if nightly:
        archive = download_nightly(layout.cache)
        name = archive.name.removesuffix(".tar.gz").replace("_", "-")
        targets.append((name, archive, False))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (target, archive, shipped) in enumerate(targets):
            tree = _unpack_any(archive, Path(tmp) / str(i))
            for version, patch in patches:
                repo_only = patch.parent.name == series.REPO_ONLY
                state = classify(tree, patch)
                if repo_only and state == "conflict":
                    state = "n/a (repo-only: file not in the sdist)"
                rows.append(
                    {
                        "target": target,
                        "shipped": shipped,
                        "series": version,
                        "patch": patch.name,
                        "state": state,
                    }
                )
    return rows


def main(argv=None) -> int:
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(prog="scripts/status")
    p.add_argument(
        "--no-nightly",
        action="store_true",
        help="only the pinned bases (no download)",
    )
    args = p.parse_args(argv)
    layout = pins.Layout.default()
    try:
        rows = radar(layout, nightly=not args.no_nightly)
    except ForkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = Table(title="upstream drift radar")
    for col in ("upstream", "series", "patch", "state"):
        table.add_column(col)
    colors = {"applies": "green", "upstream": "cyan", "conflict": "bold red"}
    for r in rows:
        color = colors.get(r["state"], "dim")
        table.add_row(
            r["target"], r["series"], r["patch"], f"[{color}]{r['state']}[/]"
        )
    Console(highlight=False).print(table)
    # Our own bases: only the patches of that base's series count.
    bad = [
        r
        for r in rows
        if r["shipped"]
        and r["series"] == r["target"]
        and r["state"] == "conflict"
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
