"""What the written PR series tells upstream about who sends it and where
it comes from: each file of ``dist/pr-series/<V>/`` read as text, for
``pr-check --in-order``.

Three rules; each problem is one line naming its file:

- **Author.** ``git mailinfo`` of each patch (what ``git am`` reads) gives
  one ``Author:`` and one ``Email:``, each a single non-empty line: the
  name without ``<`` or ``@``, the address with ``@`` (git-mailinfo(1)),
  and ``Name <email>`` equal to the builder's identity
  (``prseries.author_identity``) where that is set. The ``From:`` header
  is on one line: RFC 5322 (section 2.2.3) lets a header fold onto lines
  that start with whitespace, and ``git format-patch`` folds a long one;
  ``prseries.set_author`` writes it on one line, so a folded header is one
  it did not replace (the commits' placeholder identity), and a reader of
  its first line sees a name without an address.
- **Internal references.** No PR body (``.md``), commit message or issue
  file (``issues/``) names the series' own PR numbers (``PR 16``, ``PRs
  11``) or the fork (``fork``, ``fork's``, ``wheel``, ``carried``,
  ``Fork-Fix:``, any case; in a commit message also any trailer of
  ``patchfile.FORK_TRAILERS``): upstream numbers its PRs itself and knows
  no fork. ``#N`` and ``owner/repo#N`` are upstream's own references and
  pass. HTML comments (``<!-- ... -->``) of a Markdown file are exempt:
  GitHub does not show them (GFM spec, HTML blocks), and they are notes to
  the submitter, which the body asks to delete before sending; a comment
  never closed hides the rest of the file and is a problem. The cover
  letter (``0000-``) is the sender's note, never sent upstream, and is not
  read.
- **Closing references.** A GitHub closing keyword (``close``, ``fix``,
  ``resolve``, with ``-s`` or ``-d``, any case, an optional colon) before
  an issue reference closes that issue when the PR merges (GitHub docs,
  "Linking a pull request to an issue using a keyword"). In a PR body or a
  commit message it reads ``Fixes keras-team/keras#N`` or the placeholder
  ``Fixes #<its number>`` that ``pr-series`` writes for a bug report
  opened with the PR. Whether the PR's test covers the issue's own repro
  is for a person to judge: each body's closing references are listed.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

from keras_fork import process
from keras_fork.recipe import patchfile

COVER_PREFIX = "0000-"
# The series' own PR numbers and the fork, by kind; ``Fork-Fix:`` before
# ``fork`` so that the trailer is one match.
_INTERNAL = re.compile(
    r"(?P<pr>\bPRs? \d+\b)"
    r"|(?P<fork>(?i:\bfork-fix:|\bfork(?:['\u2019]s)?\b|\bwheel\b"
    r"|\bcarried\b))"
)
_KINDS = {"pr": "an internal PR number", "fork": "the fork"}
# A trailer line (git-interpret-trailers(1): ``Key: value``).
_TRAILER = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9-]*): \S")
# GitHub's closing keywords before an issue reference: ``#N``,
# ``owner/repo#N``, the placeholder ``#<...>`` or an issue's URL.
_CLOSING = re.compile(
    r"(?i:\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\b:?)[ \t]+"
    r"(?:[\w.-]+/[\w.-]+#\d+|#\d+|#<[^>\n]*>"
    r"|https?://github\.com/[\w.-]+/[\w.-]+/issues/\d+)"
)
_ALLOWED_CLOSING = re.compile(r"Fixes (?:keras-team/keras#\d+|#<its number>)")
_COMMENT_OPEN, _COMMENT_CLOSE = "<!--", "-->"


@dataclasses.dataclass(frozen=True)
class Report:
    """What the hygiene rules found in a written series.

    Attributes:
        problems: ``(file, problem)`` a problem, in the order the files
            were read (each patch, then its body; then the issue files).
        fixes: each patch's body's closing references (``Fixes ...``),
            for a person to check, by the patch's path.
    """

    problems: list[tuple[Path, str]]
    fixes: dict[Path, list[str]]

    def of(self, *files: Path) -> list[str]:
        """The problems found in ``files``."""
        return [p for f, p in self.problems if f in files]


def mailinfo(text: str) -> tuple[list[tuple[str, str]], list[str], str]:
    """``git mailinfo`` of a format-patch file's ``text``, as ``git am``
    reads it (the ``[PATCH k/n]`` prefix of the subject dropped).

    Returns:
        Its header output as ``(name, value)`` pairs (``Author``,
        ``Email``, ``Subject``, ``Date``), the lines of that output that are
        no ``Name: value`` line, and the commit message (subject, blank
        line, body); empty where mailinfo failed, its error as the one
        stray line.
    """
    with tempfile.TemporaryDirectory(prefix="mailinfo.") as tmp:
        msg, diff = Path(tmp) / "msg", Path(tmp) / "diff"
        proc = process.run_git(
            None, "mailinfo", str(msg), str(diff), input=text
        )
        if proc.returncode:
            error = (proc.stderr.strip() or "failed").splitlines()[0]
            return [], [f"git mailinfo: {error}"], ""
        body = msg.read_text()
    headers, stray = [], []
    for line in proc.stdout.splitlines():
        name, sep, value = line.partition(": ")
        if sep and re.fullmatch(r"[A-Z][a-z]+", name):
            headers.append((name, value))
        elif line.strip():
            stray.append(line)
    subject = next((v for n, v in headers if n == "Subject"), "")
    return headers, stray, f"{subject}\n\n{body}".rstrip("\n") + "\n"


def folded_from(text: str) -> int:
    """The number of continuation lines of the first ``From:`` header of
    ``text``'s mail header (RFC 5322 section 2.2.3: a line that starts
    with a space or a tab continues the header before it); 0 when it is
    on one line or absent."""
    head = text.split("\n\n", 1)[0].split("\n")
    for i, line in enumerate(head):
        if line.startswith("From: "):
            rest = head[i + 1 :]
            return next(
                (k for k, ln in enumerate(rest) if ln[:1] not in (" ", "\t")),
                len(rest),
            )
    return 0


def author_problems(text: str, identity: str | None, info=None) -> list[str]:
    """The author rule on a format-patch file's ``text``: its ``From:``
    header on one line, and ``git mailinfo``'s one ``Author:`` (no ``<`` or
    ``@``) and one ``Email:`` (with ``@``), both non-empty, making
    ``identity`` (``Name <email>``) where that is not None (``info``:
    ``mailinfo(text)`` where already read)."""
    problems = []
    folds = folded_from(text)
    if folds:
        problems.append(
            f"From: header folded over {folds + 1} lines (RFC 5322 folding): "
            "write the author on one line (pr-series with git config "
            "user.name and user.email set)"
        )
    headers, stray, _ = info or mailinfo(text)
    problems += [f"git mailinfo: a line of no header: {s!r}" for s in stray]
    values = {}
    for name in ("Author", "Email"):
        found = [v for n, v in headers if n == name]
        if len(found) != 1 or not found[0].strip():
            problems.append(
                f"git mailinfo: {len(found)} {name}: line(s) "
                f"{found!r}, not one non-empty value"
            )
        else:
            values[name] = found[0]
    author, email = values.get("Author"), values.get("Email")
    if author is not None and ("<" in author or "@" in author):
        problems.append(f"git mailinfo: Author {author!r} holds '<' or '@'")
    if email is not None and ("@" not in email or re.search(r"[\s<>]", email)):
        problems.append(f"git mailinfo: Email {email!r} is no address")
    if identity and author is not None and email is not None:
        if f"{author} <{email}>" != identity:
            problems.append(
                f"author {author} <{email}> is not the builder's "
                f"{identity} (git config user.name, user.email)"
            )
    return problems


def without_comments(text: str) -> tuple[str, int | None]:
    """``text`` with each HTML comment (``<!--`` to ``-->``) blanked, its
    newlines kept so that lines keep their numbers; an unclosed comment
    runs to the end, as in GFM (HTML block, type 2).

    Returns:
        The text, and the line of a ``<!--`` never closed (None when all
        close).
    """
    out, pos = [], 0
    while (start := text.find(_COMMENT_OPEN, pos)) != -1:
        out.append(text[pos:start])
        end = text.find(_COMMENT_CLOSE, start + len(_COMMENT_OPEN))
        stop = len(text) if end == -1 else end + len(_COMMENT_CLOSE)
        out.append("\n" * text.count("\n", start, stop))
        if end == -1:
            return "".join(out), text.count("\n", 0, start) + 1
        pos = stop
    out.append(text[pos:])
    return "".join(out), None


def internal_references(text: str, message: bool = False) -> list[str]:
    """The internal-reference rule on ``text``: one problem a line that
    names an internal PR number or the fork (``message``: a commit
    message, whose fork trailers count too), ``line N: names <kinds>
    ('match', ...)``."""
    problems = []
    for n, line in enumerate(text.split("\n"), start=1):
        kinds, names = [], []
        for m in _INTERNAL.finditer(line):
            kind = _KINDS[m.lastgroup]
            if kind not in kinds:
                kinds.append(kind)
            names.append(m.group(0))
        trailer = _TRAILER.match(line) if message else None
        if trailer and trailer["key"] in patchfile.FORK_TRAILERS:
            if trailer["key"] + ":" not in names:
                names.append(trailer["key"] + ":")
            if _KINDS["fork"] not in kinds:
                kinds.append(_KINDS["fork"])
        if names:
            quoted = ", ".join(repr(x) for x in names)
            problems.append(f"line {n}: names {' and '.join(kinds)} ({quoted})")
    return problems


def closing_references(text: str) -> list[tuple[int, str]]:
    """Each GitHub closing keyword with its issue reference in ``text``
    (``Fixes keras-team/keras#1``), as ``(line, text)``."""
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(0))
        for m in _CLOSING.finditer(text)
    ]


def closing_problems(text: str) -> list[str]:
    """The closing-reference rule on ``text``: each closing reference that
    is neither ``Fixes keras-team/keras#N`` nor ``Fixes #<its number>``."""
    return [
        f"line {n}: {ref!r} closes an issue other than as 'Fixes "
        "keras-team/keras#N' or the 'Fixes #<its number>' placeholder"
        for n, ref in closing_references(text)
        if not _ALLOWED_CLOSING.fullmatch(ref)
    ]


def markdown_problems(text: str, pr_body: bool) -> list[str]:
    """The rules on a Markdown file (a PR body, with ``pr_body``, or an
    issue file): its HTML comments exempt, the internal references, and
    for a PR body the closing references."""
    shown, unclosed = without_comments(text)
    problems = []
    if unclosed is not None:
        problems.append(
            f"line {unclosed}: an HTML comment '<!--' never closed hides "
            "the rest of the file"
        )
    problems += internal_references(shown)
    if pr_body:
        problems += closing_problems(shown)
    return problems


def check_patch(patch: Path, identity: str | None) -> list[str]:
    """The author rule, and the internal- and closing-reference rules on
    the commit message (``commit message line N``, line 1 the subject), of
    one patch file."""
    text = patch.read_text()
    info = mailinfo(text)
    problems = author_problems(text, identity, info)
    message = info[2]
    for problem in [
        *internal_references(message, message=True),
        *closing_problems(message),
    ]:
        problems.append("commit message " + problem)
    return problems


def check_series(
    folder: Path, patches: list[Path], identity: str | None
) -> Report:
    """The hygiene rules on ``patches`` (a written series' PR files, the
    cover letter left out), the PR body beside each (``<name>.md``, which
    must be there) and the issue files of ``folder/issues/``."""
    problems, fixes = [], {}
    for patch in patches:
        if patch.name.startswith(COVER_PREFIX):
            continue
        problems += [(patch, p) for p in check_patch(patch, identity)]
        body = patch.with_suffix(".md")
        if not body.is_file():
            problems.append((patch, f"no PR body {body.name} beside it"))
            fixes[patch] = []
            continue
        text = body.read_text()
        problems += [(body, p) for p in markdown_problems(text, True)]
        shown, _ = without_comments(text)
        fixes[patch] = list(
            dict.fromkeys(ref for _, ref in closing_references(shown))
        )
    for issue in sorted((folder / "issues").glob("*.md")):
        text = issue.read_text()
        problems += [(issue, p) for p in markdown_problems(text, False)]
    return Report(problems, fixes)
