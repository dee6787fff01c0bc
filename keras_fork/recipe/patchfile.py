"""One patch file of a series, as data: its message parsed (``PatchInfo``),
its file name from its subject, its fork trailers stripped, and its
``diff --git`` blocks taken out or put back. No git, no tree.

Discipline from Debian's DEP-3: each message says what and why,
``Fixes keras-team/keras#N`` (or ``Refs``), and ends with fork trailers
(``Fork-Fix``, ``Bug``, ``Forwarded``, ``Applied-Upstream``) that are
stripped from what is sent upstream.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import re
from pathlib import Path

from keras_fork.errors import ForkError

# Trailers that describe the patch for the fork only (DEP-3 style); they are
# removed from the PR series.
FORK_TRAILERS = ("Fork-Fix", "Bug", "Forwarded", "Applied-Upstream")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.+)$")
_FIXES = re.compile(r"^(Fixes|Refs) (keras-team/[\w.-]+#\d+)\s*$", re.M)


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
