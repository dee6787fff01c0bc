"""The patch series of a base: materialize, re-export, check, PR series.

Discipline taken from Electron's patch folders and Debian's DEP-3:

* ``patches/<version>/.patches`` lists the series in order (no number
  prefixes, so inserting a patch renames nothing);
* each patch is one ``git format-patch`` file, exported with flags that make
  re-exporting an unchanged tree byte-identical;
* each message follows DEP-3 (``patchfile``: what one patch file says).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.recipe import patchfile
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout

ORDER_FILE = ".patches"
# What a series sends upstream and what it carries (``submission``): kept by
# ``export``, which writes the patches and ``ORDER_FILE`` only.
SUBMISSION_FILES = ("submission.toml", "issues")
REPO_ONLY = "repo-only"
PRISTINE_TAG = "pristine"
# Flags that keep re-exports free of churn (Electron's `script/lib/git.py`).
EXPORT_FLAGS = (
    "--zero-commit",
    "--full-index",
    "--no-signature",
    "--no-stat",
    "--keep-subject",
)
UPSTREAM_AUTHOR = ("Keras team (PyPI sdist)", "keras-users@googlegroups.com")
COMMITTER = ("keras-fork materialize", "keras-fork@example.invalid")


def git_env(epoch: int) -> dict[str, str]:
    """An environment for reproducible git runs: no user/system config, and
    fixed identities and dates (``epoch``: seconds since the Unix epoch)."""
    env = dict(os.environ)
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_NAME=UPSTREAM_AUTHOR[0],
        GIT_AUTHOR_EMAIL=UPSTREAM_AUTHOR[1],
        GIT_COMMITTER_NAME=COMMITTER[0],
        GIT_COMMITTER_EMAIL=COMMITTER[1],
        GIT_AUTHOR_DATE=f"@{epoch} +0000",
        GIT_COMMITTER_DATE=f"@{epoch} +0000",
    )
    return env


# Runs git in a tree; returns stdout; raises ForkError on failure.
git = process.git


def series_dir(layout: Layout, base: Base) -> Path:
    return layout.patches / base.version


def _listed_names(order: Path) -> list[str]:
    """The patch file names an order file (``.patches``)
    lists, one a line; blank lines and ``#`` comments left out."""
    return [
        ln.strip()
        for ln in order.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]


def numstat(patch: Path) -> dict[str, tuple[int, int]]:
    """``{path: (lines added, lines removed)}`` of each file ``patch``
    changes, from ``git apply --numstat`` (no repository needed; a binary
    file counts 0)."""
    out = process.git(None, "apply", "--numstat", str(patch))
    counts = {}
    for line in out.splitlines():
        plus, minus, path = line.split("\t", 2)
        counts[path] = (
            int(plus) if plus.isdigit() else 0,
            int(minus) if minus.isdigit() else 0,
        )
    return counts


def line_counts(patch: Path) -> dict[str, tuple[int, int]]:
    """Lines ``patch`` adds and removes, ``{"source": (added, removed),
    "tests": (added, removed)}``: test lines are those of ``*_test.py``
    files, the way Keras names its tests (``numstat``)."""
    counts = {"source": [0, 0], "tests": [0, 0]}
    for path, (added, removed) in numstat(patch).items():
        kind = "tests" if path.endswith("_test.py") else "source"
        counts[kind][0] += added
        counts[kind][1] += removed
    return {k: (a, r) for k, (a, r) in counts.items()}


def _read_order(folder: Path, missing_ok: bool) -> list[Path]:
    """The ``*.patch`` files of ``folder`` in the order of its ``.patches``.

    Raises:
        ForkError: no order file (unless ``missing_ok``); a listed patch is
            missing; a ``.patch`` file in the folder is not listed.
    """
    order = folder / ORDER_FILE
    if not order.is_file():
        if missing_ok:
            return []
        raise ForkError(
            f"no series: create {order} (one patch file name a line; it may "
            "be empty)"
        )
    names = _listed_names(order)
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise ForkError(f"{order} lists missing patches: {', '.join(missing)}")
    unlisted = sorted(
        p.name for p in folder.glob("*.patch") if p.name not in names
    )
    if unlisted:
        raise ForkError(f"{folder} has patches not in {ORDER_FILE}: {unlisted}")
    return [folder / n for n in names]


def read_series(layout: Layout, base: Base) -> list[Path]:
    """The patch files of ``base`` in the order of ``.patches``: the series
    that is applied to the sdist tree and built into the wheel.

    Raises:
        ForkError: see ``_read_order``; the message names the base.
    """
    try:
        return _read_order(series_dir(layout, base), missing_ok=False)
    except ForkError as e:
        raise ForkError(f"base {base.version}: {e}") from None


def read_repo_only(layout: Layout, base: Base) -> list[Path]:
    """Patches to upstream files that are not in the sdist (e.g.
    ``examples/``), kept in ``patches/<version>/repo-only/``.

    They are sent upstream with the PR series but never applied to the
    materialized tree nor built into the wheel; ``check_repo_only`` checks
    them against an upstream git checkout.
    """
    return _read_order(series_dir(layout, base) / REPO_ONLY, missing_ok=True)


def check_repo_only(
    layout: Layout, base: Base, upstream: Path, rev: str | None = None
) -> list[str]:
    """Applies the repo-only patches, in order, to a scratch worktree of
    ``upstream`` (a git clone of keras-team/keras, bare or not) at ``rev``
    (default: the base's tag ``v<version>``).

    Returns:
        ``"<patch>: <git's error>"`` for each patch that does not apply.
    """
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "upstream"
        rev = rev or f"v{base.version}"
        git(upstream, "worktree", "add", "-q", "--detach", str(work), rev)
        try:
            for patch in read_repo_only(layout, base):
                proc = process.run_git(work, "apply", str(patch.resolve()))
                if proc.returncode != 0:
                    failures.append(f"{patch.name}: {proc.stderr.strip()}")
        finally:
            git(upstream, "worktree", "remove", "--force", str(work))
    return failures


def missing_tests(tree: Path, patch: Path) -> list[str]:
    """Test files (``*_test.py``) that ``patch`` changes but ``tree`` lacks.

    PyPI sdists of ``keras-nightly`` ship no test files, while the release
    sdists we pin do; a patch's test hunks cannot apply there, so
    ``materialize`` and the drift radar leave them out (``git apply
    --exclude``). Files the patch creates are not missing.

    Returns:
        Paths relative to the tree root, in patch order.
    """
    text = patch.read_text(encoding="utf-8", errors="replace")
    missing = []
    for block in text.split("\ndiff --git a/")[1:]:
        header, _, rest = block.partition("\n")
        path = header.split(" b/", 1)[0]
        creates = rest.startswith("new file mode")
        if (
            path.endswith("_test.py")
            and not creates
            and not (tree / path).exists()
        ):
            missing.append(path)
    return missing


def not_alone(tree: Path, patches: list[Path]) -> list[str]:
    """The patches that do not apply alone onto ``tree``'s ``pristine``
    commit, one line each naming the patch and git's first error.

    Upstream takes one PR at a time against master, so each PR of a master
    series must apply on master by itself, not only after the PRs before it
    in the series (docs/upstream.md). Test files the tree lacks are left
    out (see ``missing_tests``). ``tree`` is not modified: each patch is
    checked with ``git apply --cached --check`` against a temporary index of
    ``pristine``.

    Raises:
        ForkError: ``tree`` has no ``pristine`` tag.
    """
    failed = []
    with tempfile.TemporaryDirectory(prefix="alone.") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(tree, "read-tree", PRISTINE_TAG, env=env)
        for patch in patches:
            excludes = [f"--exclude={p}" for p in missing_tests(tree, patch)]
            proc = process.run_git(
                tree,
                "apply",
                "--cached",
                "--check",
                *excludes,
                str(patch.resolve()),
                env=env,
            )
            if proc.returncode:
                error = (proc.stderr.strip().splitlines() or ["?"])[0]
                failed.append(f"{patch.name}: {error}")
    return failed


def _failing_file(output: str) -> str:
    for pattern in (
        r"error: patch failed: ([^:\n]+):\d+",
        r"error: ([^:\n]+): does not exist in index",
        r"error: ([^:\n]+): already exists in index",
        r"error: ([^:\n]+): patch does not apply",
    ):
        m = re.search(pattern, output)
        if m:
            return m.group(1)
    return "(git am named no file)"


def init_pristine(work: Path, base: Base, archive: Path, env) -> None:
    """A new git repo at ``work`` whose one commit, tagged ``pristine``, is
    the unpacked, verified sdist ``archive`` of ``base``."""
    sdist_lib.unpack(archive, base, work)
    git(work, "init", "-q", "-b", "main", env=env)
    git(work, "add", "-A", env=env)
    git(
        work,
        "commit",
        "-q",
        "-m",
        f"Keras {base.version}: pristine PyPI sdist\n\n"
        f"sha256 {base.sdist_sha256}",
        env=env,
    )
    git(work, "tag", PRISTINE_TAG, env=env)


def materialize(layout: Layout, base: Base, sdist: Path | None = None) -> Path:
    """Builds ``build/trees/<version>``: pristine sdist commit + the series.

    The first commit (tagged ``pristine``) is the unpacked, verified sdist;
    each patch is one ``git am`` commit on top. Dates and identities are
    fixed, so the commit ids are reproducible.

    Returns:
        The path of the tree.

    Raises:
        ForkError: sdist problems (see ``sdist.fetch``), series problems (see
            ``read_series``), or a patch that does not apply: the message
            names the patch and the failing file. The previous tree is
            removed first, so a failure never leaves a tree looking ready.
    """
    patches = read_series(layout, base)
    archive = sdist_lib.fetch(layout, base, sdist)
    epoch = sdist_lib.source_date_epoch(archive, base)
    env = git_env(epoch)
    dest = layout.tree(base.version)
    stamp = _inputs_digest(base, patches)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    with tempfile.TemporaryDirectory(
        dir=dest.parent, prefix=f".{base.version}."
    ) as tmp:
        work = Path(tmp) / "tree"
        init_pristine(work, base, archive, env)
        for patch in patches:
            # A base whose sdist has no test files (keras-nightly) gets the
            # source hunks only; its test hunks are checked on a Keras git
            # checkout (see docs/upstream.md).
            absent = [] if base.sdist_tests else missing_tests(work, patch)
            excludes = [f"--exclude={f}" for f in absent]
            proc = process.run_git(
                work,
                "am",
                "-q",
                "--keep",
                *excludes,
                "--committer-date-is-author-date",
                str(patch.resolve()),
                env=env,
            )
            if proc.returncode != 0:
                out = proc.stdout + proc.stderr
                raise ForkError(
                    f"patch {patch.name} does not apply to keras "
                    f"{base.version}: failing file "
                    f"{_failing_file(out)}\n{out.strip()}"
                )
        head = git(work, "rev-parse", "HEAD").strip()
        (work / ".git" / STAMP).write_text(f"{stamp} {head}\n")
        work.rename(dest)
    return dest


# In a tree's .git folder: what it was materialized from, and its HEAD then.
STAMP = "keras-fork-inputs"
# Changes when the rules by which ``materialize`` applies a series change.
_MATERIALIZE_RULES = "git am --keep --committer-date-is-author-date; 1"


def _inputs_digest(base: Base, patches: list[Path]) -> str:
    """sha256 of what decides a materialized tree: the base's pinned sdist
    and whether its test files are kept, the patches (names and bytes) in
    order, and ``materialize``'s rules."""
    h = hashlib.sha256(_MATERIALIZE_RULES.encode())
    h.update(f"{base.version} {base.sdist_sha256} {base.sdist_tests}".encode())
    for patch in patches:
        h.update(f"\0{patch.name}\0".encode())
        h.update(patch.read_bytes())
    return h.hexdigest()


def tree_of(layout: Layout, base: Base, sdist: Path | None = None) -> Path:
    """``build/trees/<version>`` as ``materialize`` makes it from the
    series now, materialized only when the one there is not that: its
    stamp names other inputs (``_inputs_digest``) or another ``HEAD``, or
    its tracked files differ from ``HEAD``. One ``scripts/build`` or
    ``scripts/test`` thus materializes each base once.

    Raises:
        ForkError: what ``materialize`` raises.
    """
    dest = layout.tree(base.version)
    stamp = dest / ".git" / STAMP
    if stamp.is_file():
        digest, _, head = stamp.read_text().strip().partition(" ")
        if (
            digest == _inputs_digest(base, read_series(layout, base))
            and process.run_git(dest, "rev-parse", "HEAD").stdout.strip()
            == head
            and not process.run_git(
                dest, "status", "--porcelain", "--untracked-files=no"
            ).stdout.strip()
        ):
            sdist_lib.fetch(layout, base, sdist)  # checked, as materialize
            return dest
    return materialize(layout, base, sdist)


def format_patch(tree: Path, out: Path, flags=EXPORT_FLAGS) -> list[Path]:
    """``git format-patch`` of the commits after ``pristine`` into ``out``.

    Returns:
        The written files, in series order.
    """
    epoch_env = git_env(0)
    git(
        tree,
        "format-patch",
        *flags,
        "-o",
        str(out),
        f"{PRISTINE_TAG}..HEAD",
        env=epoch_env,
    )
    return sorted(out.glob("*.patch"))


def export(tree: Path, out: Path, carry_tests: bool = False) -> list[str]:
    """Writes the commits of ``tree`` after ``pristine`` as a series folder.

    ``out`` gets one ``<subject-slug>.patch`` file a commit
    (``patch_file_name``) and ``.patches``, the order; its repo-only
    patches, ``submission.toml`` and design issues are kept
    (``submission.read`` names a patch they then leave out). The folder
    is replaced as a whole (written beside it, then renamed).

    With ``carry_tests`` (a base whose sdist has no test files, so its tree
    has none), each patch keeps the test hunks of the file of the same name
    in ``out`` for test files the tree lacks (``missing_tests``): a commit
    edited in the tree keeps its upstream-style tests, as long as its
    subject, hence its file name, is unchanged.

    Returns:
        The patch names in order.

    Raises:
        ForkError: two commits' subjects give the same file name.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export.") as tmp:
        staged = Path(tmp) / "series"
        staged.mkdir()
        names = []
        for f in format_patch(tree, staged):
            name = patchfile.patch_file_name(patchfile.parse_patch(f).subject)
            if name in names:
                raise ForkError(f"two commits export to the same name {name}")
            f.rename(staged / name)
            names.append(name)
            if carry_tests and (out / name).is_file():
                old = (out / name).read_bytes()
                tests = missing_tests(tree, out / name)
                (staged / name).write_bytes(
                    patchfile.with_files(
                        (staged / name).read_bytes(), old, tests
                    )
                )
        (staged / ORDER_FILE).write_text("".join(n + "\n" for n in names))
        old = Path(tmp) / "old"
        if out.exists():
            out.rename(old)
            # Repo-only patches are not in the tree, nor is what the
            # series sends upstream: carry them over.
            for kept in (REPO_ONLY, *SUBMISSION_FILES):
                if (old / kept).exists():
                    (old / kept).rename(staged / kept)
        staged.rename(out)
    return names


def check(layout: Layout, base: Base, tree: Path) -> list[str]:
    """Re-exports ``tree`` and compares with ``patches/<version>``.

    For a base whose sdist has no test files, each patch is compared
    without the test files the tree lacks (``materialize`` left them out).

    Returns:
        The names of the files that differ (empty when the export reproduces
        ``patches/`` byte for byte).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "series"
        export(tree, out)
        folder = series_dir(layout, base)
        ours = {p.name: p.read_bytes() for p in out.iterdir()}
        theirs = {
            p.name: p.read_bytes()
            for p in folder.iterdir()
            if p.suffix == ".patch" or p.name == ORDER_FILE
        }
        if not base.sdist_tests:  # the tree has the source hunks only
            theirs = {
                n: patchfile.without_files(t, missing_tests(tree, folder / n))
                if n.endswith(".patch")
                else t
                for n, t in theirs.items()
            }
    return sorted(
        n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n)
    )
