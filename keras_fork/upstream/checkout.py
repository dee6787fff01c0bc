"""A scratch worktree of a Keras git checkout, for the verbs that try PRs
on upstream (``pr-check``, ``pr-tests``).

Upstream's git history is newer than a release and, between snapshots,
older than the newest nightly: a PR written against the nightly's code
does not apply to a checkout taken before it. ``source="base"`` then
puts the base's own source (its pinned sdist, hash-checked) over the
checkout's, keeping the checkout's test files, which the nightly sdist
does not ship: the nearest thing to master at the nightly's commit.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe import sdist as sdist_lib

SOURCES = ("checkout", "base")
# The committer of what is committed in a scratch worktree (git refuses to
# commit without one, and the user's may be unset).
IDENTITY = (
    "-c",
    "user.name=keras-fork",
    "-c",
    "user.email=keras-fork@example.invalid",
)


def add_arguments(p, repo_help: str, source: str, source_help: str) -> None:
    """Registers a verb's options for a Keras checkout: ``--upstream-repo``
    (a git clone, not bare; ``repo_help`` says what for), ``--rev`` (default
    ``master``) and ``--source`` (one of ``SOURCES``, default ``source``,
    ``source_help`` its help)."""
    p.add_argument("--upstream-repo", required=True, type=Path, help=repo_help)
    p.add_argument("--rev", default="master", help="revision (default master)")
    p.add_argument(
        "--source", choices=SOURCES, default=source, help=source_help
    )


# ``git -C repo args``, never raising: the ``subprocess.CompletedProcess``.
git = process.run_git


def apply(tree: Path, diff: str, *flags: str) -> tuple[bool, list[str]]:
    """``git apply`` of ``diff`` (a patch's text) in the worktree: as it
    is, else by a three-way merge (``--3way``: where the checkout has the
    blobs the diff was made from). A failed plain apply writes nothing.

    Returns:
        ``(applied, errors)``: ``errors`` holds the first error line of
        each attempt that failed, in order (empty when the plain one
        applied).
    """
    errors = []
    for way in ((), ("--3way",)):
        proc = git(tree, "apply", *way, *flags, "-", input=diff)
        if proc.returncode == 0:
            return True, errors
        lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
        errors.append((lines or proc.stderr.strip().splitlines() or ["?"])[0])
    return False, errors


def _base_source(worktree: Path, layout: pins.Layout, base: pins.Base):
    """Replaces ``worktree/keras`` by the base's sdist ``keras/``, keeping
    the checkout's ``*_test.py`` files and its repo-only ``keras/__init__.py``
    (a path hack for running from the repository root), and commits it."""
    path = sdist_lib.fetch(layout, base)
    with tempfile.TemporaryDirectory() as tmp:
        unpacked = Path(tmp) / "sdist"
        sdist_lib.unpack(path, base, unpacked)
        theirs = {
            p.relative_to(unpacked).as_posix()
            for p in (unpacked / "keras").rglob("*")
            if p.is_file()
        }
        ours = git(worktree, "ls-files", "keras").stdout.split()
        stale = [
            f
            for f in ours
            if f not in theirs
            and not f.endswith("_test.py")
            and f != "keras/__init__.py"
        ]
        if stale:
            git(worktree, "rm", "-q", "--", *stale)
        for rel in theirs:
            dest = worktree / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes((unpacked / rel).read_bytes())
    git(worktree, "add", "-A", "keras")
    proc = git(
        worktree,
        *IDENTITY,
        "commit",
        "-q",
        "-m",
        f"{base.requirement} source on this checkout's test files",
    )
    if proc.returncode:
        raise ForkError(f"could not commit the base's source: {proc.stderr}")


@contextlib.contextmanager
def worktree(
    repo: Path,
    rev: str,
    source: str = "checkout",
    layout: pins.Layout | None = None,
    base: pins.Base | None = None,
):
    """A detached worktree of ``repo`` at ``rev``, removed on exit.

    Args:
        repo: a Keras git clone (not bare).
        rev: the revision, e.g. ``master``.
        source: ``checkout`` (as it is) or ``base`` (the base's sdist source
            over it, test files kept; needs ``layout`` and ``base``).

    Yields:
        ``(path, commit)``: the worktree and the commit to reset it to
        between PRs.

    Raises:
        ForkError: ``repo`` is not a git repository with ``rev``, an unknown
            ``source``, or the base's sdist cannot be had.
    """
    if source not in SOURCES:
        raise ForkError(f"unknown source {source!r}; one of {SOURCES}")
    if git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").returncode:
        raise ForkError(f"{repo} is not a git repository with revision {rev}")
    with tempfile.TemporaryDirectory(prefix="keras-checkout.") as tmp:
        path = Path(tmp) / "keras"
        proc = git(repo, "worktree", "add", "-q", "--detach", str(path), rev)
        if proc.returncode:
            raise ForkError(f"git worktree add failed: {proc.stderr.strip()}")
        try:
            if source == "base":
                _base_source(path, layout, base)
            yield path, git(path, "rev-parse", "HEAD").stdout.strip()
        finally:
            git(repo, "worktree", "remove", "--force", str(path))


def reset(path: Path, commit: str) -> None:
    """Puts the worktree back to ``commit``, untracked files removed."""
    git(path, "reset", "-q", "--hard", commit)
    git(path, "clean", "-qfdx")
