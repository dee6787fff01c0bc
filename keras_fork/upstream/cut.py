"""Each PR of a series cut from the base's pristine source, the way a
contributor cuts a PR branch from upstream master.

A base's series is a chain: patch k is written against the tree as
patches 1..k-1 left it, so the ``index`` lines of its source hunks name
blobs that exist only in that chain. Upstream takes one PR at a time:
a PR file must name the blobs of master, so that it applies alone and,
after the maintainers merged the PRs sent before it, ``git am -3`` can
fall back on a three-way merge where lines moved.

For a base whose sdist ships no test files (the nightly, i.e. master at
its commit), the pristine sdist is master's source: each PR's source
hunks are applied alone on ``pristine`` (``git am -3``, the chain's
blobs being in the materialized tree's repository) and exported again,
and its test hunks, which are already written against master's test
files (``pr-tests``), are kept as they are (``patchfile.with_files``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from keras_fork.errors import ForkError
from keras_fork.recipe import patchfile
from keras_fork.recipe import series


def cut(tree: Path, patches: list[Path], out: Path) -> list[Path]:
    """Writes each of ``patches`` cut from ``pristine`` into ``out``.

    Args:
        tree: the base's materialized tree (a git repository with the
            ``pristine`` tag and the series' commits).
        patches: patch files of the series (``patches/<V>/*.patch``).
        out: an existing folder; each cut patch gets its patch's name.

    Returns:
        The written files, in the order of ``patches``.

    Raises:
        ForkError: a patch's source hunks do not apply alone on
            ``pristine``, not even by a three-way merge (it depends on an
            earlier patch of the chain).
    """
    env = series.git_env(0)
    written = []
    with tempfile.TemporaryDirectory(dir=out, prefix=".cut.") as tmp:
        work = Path(tmp) / "work"
        series.git(
            tree,
            "worktree",
            "add",
            "-q",
            "--detach",
            str(work),
            series.PRISTINE_TAG,
        )
        try:
            for patch in patches:
                written.append(_cut_one(work, patch, out / patch.name, env))
        finally:
            series.git(
                tree, "worktree", "remove", "--force", str(work), check=False
            )
    return written


def _cut_one(work: Path, patch: Path, dest: Path, env: dict) -> Path:
    """``patch``'s source hunks applied on ``pristine`` in ``work`` and
    exported, its test hunks for files the tree lacks kept as they are."""
    series.git(work, "reset", "-q", "--hard", series.PRISTINE_TAG)
    tests = series.missing_tests(work, patch)
    excludes = [f"--exclude={p}" for p in tests]
    try:
        series.git(work, "am", "-3", "-k", "-q", *excludes, str(patch), env=env)
    except ForkError as e:
        series.git(work, "am", "--abort", check=False)
        raise ForkError(
            f"{patch.name} does not apply alone on the pristine source: "
            f"it depends on an earlier patch of the series\n{e}"
        ) from None
    text = series.git(
        work,
        "format-patch",
        *series.EXPORT_FLAGS,
        "--stdout",
        "-1",
        "HEAD",
        env=env,
    )
    cut = patchfile.with_files(text.encode(), patch.read_bytes(), tests)
    dest.write_bytes(cut)
    return dest
