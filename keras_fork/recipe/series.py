"""The patch series of a base: materialize, re-export, check, PR series.

Discipline taken from Electron's patch folders and Debian's DEP-3:

* ``patches/<version>/.patches`` lists the series in order (no number
  prefixes, so inserting a patch renames nothing);
* each patch is one ``git format-patch`` file, exported with flags that make
  re-exporting an unchanged tree byte-identical;
* each message says what and why, ``Fixes keras-team/keras#N``, and ends
  with fork trailers (``Fork-Fix``, ``Bug``, ``Forwarded``,
  ``Applied-Upstream``) that are stripped from what is sent upstream.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from keras_fork.errors import ForkError
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout

ORDER_FILE = ".patches"
# What a series sends upstream and what it carries (``submission``): kept by
# ``export``, which writes the patches and ``ORDER_FILE`` only.
SUBMISSION_FILES = ("submission.toml", "issues")
REPO_ONLY = "repo-only"
PRISTINE_TAG = "pristine"
# Trailers that describe the patch for the fork only (DEP-3 style); they are
# removed from the PR series.
FORK_TRAILERS = ("Fork-Fix", "Bug", "Forwarded", "Applied-Upstream")
# Flags that keep re-exports free of churn (Electron's `script/lib/git.py`).
EXPORT_FLAGS = (
    "--zero-commit",
    "--full-index",
    "--no-signature",
    "--no-stat",
    "--keep-subject",
)
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.+)$")
_FIXES = re.compile(r"^(Fixes|Refs) (keras-team/[\w.-]+#\d+)\s*$", re.M)
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


def git(tree: Path, *args: str, env=None, check=True) -> str:
    """Runs git in ``tree``; returns stdout. Raises ForkError on failure."""
    proc = subprocess.run(
        ["git", "-C", str(tree), *args],
        capture_output=True,
        text=True,
        env=env,
    )
    if check and proc.returncode != 0:
        raise ForkError(
            f"git {' '.join(args)} failed in {tree}:\n"
            f"{(proc.stdout + proc.stderr).strip()}"
        )
    return proc.stdout


@dataclasses.dataclass(frozen=True)
class PatchInfo:
    """What a patch file says about itself.

    Attributes:
        name: file name in ``patches/<version>/``.
        subject: the commit subject.
        message: the commit message without the fork trailers.
        trailers: fork trailers, e.g. ``{"Fork-Fix": "seeded-shuffle"}``.
        upstream_issue: ``keras-team/keras#N`` from the ``Fixes`` or
            ``Refs`` line.
        diff: the patch's diff text.
        closes: whether that line is ``Fixes`` (the patch closes the
            issue) rather than ``Refs`` (it addresses part of it).
    """

    name: str
    subject: str
    message: str
    trailers: dict
    upstream_issue: str | None
    diff: str
    closes: bool = False

    @property
    def fix(self) -> str | None:
        return self.trailers.get("Fork-Fix")

    @property
    def fixes(self) -> tuple[str, ...]:
        """The fix ids of the ``Fork-Fix:`` trailers: one a line, repeated
        when one patch carries fixes that are separate on another base
        (e.g. the shuffle fixes, one upstream PR on master)."""
        return tuple(f.strip() for f in (self.fix or "").split(",") if f)

    @property
    def upstream_status(self) -> str:
        """Where upstream stands on the patch, from its DEP-3 trailers
        (``Forwarded``, ``Applied-Upstream``; kept out of the PR series):
        ``not-yet``, ``submitted <url>`` or ``fixed-upstream <version>``."""
        applied = self.trailers.get("Applied-Upstream", "no")
        forwarded = self.trailers.get("Forwarded", "no")
        if applied not in ("no", ""):
            return f"fixed-upstream {applied}"
        if forwarded not in ("no", ""):
            return f"submitted {forwarded}"
        return "not-yet"

    def manifest_entry(self) -> dict:
        """The patch as listed in the wheel's ``FORK_PATCHES.json``."""
        return {
            "name": self.name,
            "subject": self.subject,
            "fix": self.fix,
            "upstream_issue": self.upstream_issue,
            "bug": self.trailers.get("Bug"),
            "forwarded": self.trailers.get("Forwarded"),
            "applied_upstream": self.trailers.get("Applied-Upstream"),
        }

    def added_tests(self) -> list[str]:
        """``path::test_name`` of each test function the diff adds: a
        module-level function or a method of a module-level class (indented
        at most 4 spaces). A deeper ``def test_...`` is nested in a test,
        e.g. a model's ``test_step`` override, and is not collected; nor is
        a method of a class the diff shows is no test class (pytest
        collects ``Test*`` classes and ``unittest.TestCase`` subclasses,
        e.g. ``class CustomModel(models.Sequential)`` overriding
        ``test_step``). A method whose class the diff does not show (an
        added method in a hunk without its class line) is collected."""
        tests, path, in_test_class = [], None, True
        for line in self.diff.splitlines():
            if line.startswith("+++ b/"):
                path = line[6:]
            header = re.match(r"^@@ [^@]* @@ ?(.*)$", line)
            if header:  # git names the enclosing class or function, if any
                in_test_class = _is_test_class(header.group(1))
                continue
            if re.match(r"^[+ ](class|def) ", line):
                in_test_class = _is_test_class(line[1:])
            m = re.match(r"^\+( {0,4})def (test_\w+)\(", line)
            if m and path and (not m.group(1) or in_test_class):
                tests.append(f"{path}::{m.group(2)}")
        return tests


def _is_test_class(line: str) -> bool:
    """Whether a module-level line opens a class pytest may collect:
    ``class Test...`` or a base naming ``TestCase``; ``True`` when it is
    no class line (unknown context keeps methods collected)."""
    m = re.match(r"class (\w+)(\((.*)\))?:", line)
    if not m:
        return not line.startswith("def ")
    return m.group(1).startswith("Test") or "TestCase" in (m.group(3) or "")


def parse_patch(path: Path) -> PatchInfo:
    """Reads a ``git format-patch`` file.

    Raises:
        ForkError: the file has no Subject or no diff.
    """
    text = path.read_text()
    msg = email.message_from_string(text, policy=email.policy.compat32)
    subject = " ".join(str(msg.get("Subject", "")).split())
    if not subject:
        raise ForkError(f"{path} is not a git format-patch file (no Subject)")
    body = msg.get_payload()
    head, sep, diff = body.partition("\n---\n")
    if not sep and "\ndiff --git " in body:
        head, _, diff = body.partition("\ndiff --git ")
        diff = "diff --git " + diff
    if "diff --git " not in diff:
        raise ForkError(f"{path} holds no diff")
    paragraphs = head.strip().split("\n\n")
    trailers, kept = {}, paragraphs
    last = paragraphs[-1].splitlines() if paragraphs else []
    if last and all(_TRAILER.match(line) for line in last):
        for line in last:
            key, value = _TRAILER.match(line).groups()
            if key in FORK_TRAILERS:  # a repeated one: comma-separated
                trailers[key] = ", ".join(
                    filter(None, (trailers.get(key), value))
                )
        rest = [
            ln
            for ln in last
            if _TRAILER.match(ln).group(1) not in FORK_TRAILERS
        ]
        kept = paragraphs[:-1] + (["\n".join(rest)] if rest else [])
    message = "\n\n".join(kept).strip()
    fixes = _FIXES.search(message)
    return PatchInfo(
        name=path.name,
        subject=subject,
        message=message,
        trailers=trailers,
        upstream_issue=fixes.group(2) if fixes else None,
        diff=diff,
        closes=bool(fixes) and fixes.group(1) == "Fixes",
    )


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
    out = subprocess.run(
        ["git", "apply", "--numstat", str(patch)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
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
                proc = subprocess.run(
                    ["git", "-C", str(work), "apply", str(patch.resolve())],
                    capture_output=True,
                    text=True,
                )
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
    in the series (issue 24). Test files the tree lacks are left out (see
    ``missing_tests``). ``tree`` is not modified: each patch is checked with
    ``git apply --cached --check`` against a temporary index of
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
            proc = subprocess.run(
                [
                    "git",
                    "-C",
                    str(tree),
                    "apply",
                    "--cached",
                    "--check",
                    *excludes,
                    str(patch.resolve()),
                ],
                capture_output=True,
                text=True,
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
            proc = subprocess.run(
                [
                    "git",
                    "-C",
                    str(work),
                    "am",
                    "-q",
                    "--keep",
                    *excludes,
                    "--committer-date-is-author-date",
                    str(patch.resolve()),
                ],
                capture_output=True,
                text=True,
                env=env,
            )
            if proc.returncode != 0:
                out = proc.stdout + proc.stderr
                raise ForkError(
                    f"patch {patch.name} does not apply to keras "
                    f"{base.version}: failing file "
                    f"{_failing_file(out)}\n{out.strip()}"
                )
        work.rename(dest)
    return dest


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


SLUG_MAX = 80


def patch_file_name(subject: str) -> str:
    """The file name of a patch in ``patches/<V>/``: the lowercase slug of
    its subject plus ``.patch``, as Electron names its patches.

    Every run of characters other than ``a-z0-9`` becomes one ``-``. A slug
    longer than ``SLUG_MAX`` (80) characters is cut at the last ``-``
    before the limit, so never mid-word (``git format-patch`` cuts at 52
    characters, wherever that falls).

    Example: ``"Normalize distributed losses by the step's global batch
    size"`` -> ``normalize-distributed-losses-by-the-step-s-global-batch-
    size.patch``.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")
    if len(slug) > SLUG_MAX:
        slug = slug[: SLUG_MAX + 1].rsplit("-", 1)[0]
    return f"{slug or 'patch'}.patch"


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
            name = patch_file_name(parse_patch(f).subject)
            if name in names:
                raise ForkError(f"two commits export to the same name {name}")
            f.rename(staged / name)
            names.append(name)
            if carry_tests and (out / name).is_file():
                old = (out / name).read_bytes()
                tests = missing_tests(tree, out / name)
                (staged / name).write_bytes(
                    with_files((staged / name).read_bytes(), old, tests)
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


FORMAT_PATCH_SLUG_MAX = 52


def format_patch_name(subject: str) -> str:
    """The name ``git format-patch`` gives a patch with this subject, less
    its ``NNNN-`` number: git's rule (``format_sanitized_subject`` in
    git's ``pretty.c``; ``fmt_output_subject`` in ``log-tree.c`` cuts
    ``NNNN-<slug>`` to 64 characters less ``.patch`` and one more, i.e.
    the slug to 52). Used for files git does not write itself (the
    repo-only patches of the PR series); ``tests/`` checks it against git
    on every patch of the series.
    """
    out, space, prev = [], 2, ""
    for ch in subject.replace("\n", " "):
        if (ch.isascii() and ch.isalnum()) or ch in "._":
            if ch == "." and prev == ".":
                continue  # git collapses runs of dots
            if space == 1:
                out.append("-")
            space = 0
            out.append(ch)
        else:
            space |= 1
        prev = ch
    slug = "".join(out).rstrip(".-")
    return slug[:FORMAT_PATCH_SLUG_MAX] + ".patch"


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
                n: without_files(t, missing_tests(tree, folder / n))
                if n.endswith(".patch")
                else t
                for n, t in theirs.items()
            }
    return sorted(
        n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n)
    )


def without_files(patch: bytes, paths: list[str]) -> bytes:
    """A ``git format-patch --no-stat`` file's bytes without the ``diff
    --git`` blocks of ``paths``: what exporting the commit would give if
    those files had not been in it."""
    if not paths:
        return patch
    head, *blocks = re.split(rb"(?m)^(?=diff --git a/)", patch)
    drop = {f"diff --git a/{p} b/{p}\n".encode() for p in paths}
    kept = [b for b in blocks if b[: b.index(b"\n") + 1] not in drop]
    return b"".join([head, *kept])


def with_files(patch: bytes, source: bytes, paths: list[str]) -> bytes:
    """``patch`` (a ``git format-patch --no-stat`` file's bytes) with the
    ``diff --git`` blocks of ``paths`` taken from ``source``, all blocks in
    path order as git writes them: the inverse of ``without_files``."""
    if not paths:
        return patch
    head, *blocks = re.split(rb"(?m)^(?=diff --git a/)", patch)
    _, *theirs = re.split(rb"(?m)^(?=diff --git a/)", source)
    wanted = {f"diff --git a/{p} b/{p}\n".encode() for p in paths}
    blocks += [b for b in theirs if b[: b.index(b"\n") + 1] in wanted]
    blocks.sort(key=lambda b: b[: b.index(b" b/")])
    return b"".join([head, *blocks])


def strip_fork_trailers(text: str) -> str:
    """Removes the fork trailer lines from a format-patch file's message
    (the part before the first ``---`` line); the diff is untouched."""
    head, sep, rest = text.partition("\n---\n")
    keep = [
        ln
        for ln in head.split("\n")
        if not (_TRAILER.match(ln) and ln.split(":")[0] in FORK_TRAILERS)
    ]
    head = re.sub(r"\n{3,}", "\n\n", "\n".join(keep)).rstrip("\n") + "\n"
    return head + sep + rest
