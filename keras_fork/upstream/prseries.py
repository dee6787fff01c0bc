"""The PR series: what maintainers read upstream
(``python -m keras_fork pr-series``).

``dist/pr-series/<version>/`` holds ``git format-patch`` files (numbered, with
a cover letter) that ``git am`` cleanly onto the pristine sdist tree, with the
fork-only trailers removed, and one markdown PR body a patch. For a base
whose sdist has no test files (``keras-nightly``), they are the series'
own patches, test hunks included: they apply to a Keras git checkout.

Its own stage, after the proof: it reads ``patches/<V>`` (through a tree it
materializes and checks itself, never ``build/trees/<V>``, which may hold
work not yet exported) and, where present, the proof's results
(``dist/proof.json``) and the last ``pr-check`` (``dist/pr-check-<V>.json``).
``scripts/build`` runs it after ``build``; ``scripts/test`` again after the
proof matrix, so that the bodies carry the proof.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from pathlib import Path

from keras_fork import options
from keras_fork import outputs
from keras_fork import process
from keras_fork.recipe import patchfile
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe import series
from keras_fork.recipe import submission
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout
from keras_fork.upstream import cut
from keras_fork.upstream import prbody

# The integration tests of each PR, for the person who sends it (the body
# holds only what a reviewer can see and run).
INTEGRATION_DIR = "integration"
# Upstream reviewers get numbered patches, a cover letter and a diffstat.
PR_FLAGS = (
    "--zero-commit",
    "--full-index",
    "--no-signature",
    "--numbered",
    "--cover-letter",
)


def pr_series_dir(layout: Layout, base: Base) -> Path:
    """Where the PR series of ``base`` is written:
    ``dist/pr-series/<version>/``."""
    return layout.dist / "pr-series" / base.version


def add_arguments(p) -> None:
    """The ``pr-series`` verb's options (scripts/build passes build's
    options on)."""
    options.add_bases(p)
    options.add_sdist(p)


def main(args, layout: Layout) -> int:
    """``python -m keras_fork pr-series``: writes
    ``dist/pr-series/<V>/`` of each selected base from ``patches/<V>``,
    with the proof rows of ``dist/proof.json`` and the ``pr-check`` rows
    where those exist.

    Every base's sdist is checked (cached, sha256) before any output
    changes; each base's folder is replaced whole (``write``), so a failure
    leaves the previous series as they were.

    Raises:
        ForkError: an unknown base, ``--sdist`` with several bases, a bad
            or missing sdist (``sdist.fetch``), or a series that fails
            ``submission.checked_tree`` (a patch that does not apply, not in
            canonical form, a master PR that does not apply alone).
    """
    from rich.console import Console

    bases = sdist_lib.fetch_selected(layout, args.base, args.sdist)
    _remove_scratch(layout)
    console = Console(stderr=True, highlight=False)
    with_proof = " (with dist/proof.json)" if proof_cells(layout) else ""
    for base in bases:
        with console.status(f"keras {base.version}: the PR series"):
            dest = write_from_patches(layout, base)
        where = dest.relative_to(layout.root)
        console.print(f"[green]wrote[/] {where}/{with_proof}")
    return 0


def _remove_scratch(layout: Layout) -> None:
    """Removes the scratch folders of a run that was killed (no cleanup
    ran): its trees under ``build/`` and its staged or set-aside series
    under ``dist/pr-series/``."""
    for scratch in [
        *layout.build.glob(".pr-series.*"),
        *layout.dist.glob("pr-series/.*"),
    ]:
        shutil.rmtree(scratch, ignore_errors=True)


def write_from_patches(layout: Layout, base: Base) -> Path:
    """Materializes and checks ``base``'s tree in a scratch folder under
    ``build/`` (``submission.checked_tree``), then writes its PR series from it
    (``write``).

    Returns:
        The folder ``dist/pr-series/<version>/``.
    """
    layout.build.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        dir=layout.build, prefix=".pr-series."
    ) as scratch:
        tree = submission.checked_tree(
            dataclasses.replace(layout, build=Path(scratch)), base
        )
        return write(layout, base, tree)


def proof_cells(layout: Layout) -> list[dict]:
    """The cells of ``dist/proof.json`` (empty when the matrix never ran)."""
    try:
        return json.loads(layout.proof.read_text())["cells"]
    except (FileNotFoundError, KeyError, ValueError):
        return []


def pr_cells(layout: Layout, base: Base, cells: list[dict]) -> list[dict]:
    """The proof cells a PR body of ``base`` may report: those of fixes
    that no carried patch of ``base`` carries too. The integration tests
    run on the wheel, so a fix the wheel carries beyond its PR passes them
    with more than the PR (``submission``)."""
    sub = submission.read(layout, base)
    carried = {
        f for c in sub.carried for f in patchfile.parse_patch(c.patch).fixes
    }
    return [c for c in cells if c.get("fix") not in carried]


def pr_check_rows(layout: Layout, base: Base) -> dict:
    """The rows of the last ``pr-check`` of ``base``
    (``dist/pr-check-<V>.json``) by patch file name, each with the
    checkout's ``rev`` and ``source``; empty when it never ran."""
    try:
        doc = json.loads(
            (layout.dist / f"pr-check-{base.version}.json").read_text()
        )
    except (FileNotFoundError, ValueError):
        return {}
    where = {"rev": doc.get("rev"), "source": doc.get("source", "checkout")}
    return {r["patch"]: dict(r, **where) for r in doc.get("rows", [])}


def write(layout: Layout, base: Base, tree: Path) -> Path:
    """Writes ``dist/pr-series/<version>/`` from the materialized ``tree``.

    The folder is replaced as a whole (staged beside it, then renamed).

    Returns:
        The folder.
    """
    dest = pr_series_dir(layout, base)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".pr.") as tmp:
        staged = stage(layout, base, tree, Path(tmp) / "series")
        outputs.replace_dir(staged, dest)
    return dest


def stage(layout: Layout, base: Base, tree: Path, into: Path) -> Path:
    """Writes the PR series of ``base`` from the materialized ``tree`` into
    the new folder ``into`` (which must not exist): the numbered PRs to
    send now with the cover letter, and, for a series with a
    ``submission.toml``, the PRs that wait on a design issue under
    ``pending/`` and the design issues under ``issues/``
    (``submission``). Carried patches are in none of them.

    Returns:
        ``into``.
    """
    sub = submission.read(layout, base)
    into.mkdir()
    if base.sdist_tests:
        chain = series.read_series(layout, base)
    else:  # sent one PR at a time, in submission order, cut from master
        sub = _cut_from_pristine(tree, sub, into)
        chain = [p.patch for p in sub.send_now]
    infos = [patchfile.parse_patch(p) for p in chain]
    repo_only = series.read_repo_only(layout, base)
    cells = pr_cells(layout, base, proof_cells(layout))
    if infos:  # an empty series has nothing to send, not even a cover
        if base.sdist_tests:
            files = series.format_patch(tree, into, PR_FLAGS)
        else:  # the tree lacks the test hunks: send the patches
            files = [into / "0000-cover-letter.patch"]
            files += _copy_patches(into, chain, 0)
        files += _copy_patches(into, repo_only, len(infos))
        infos += [patchfile.parse_patch(p) for p in repo_only]
        _finish(layout, base, files, infos, cells)
        if not base.sdist_tests:
            _write_waiting(layout, base, into, sub, cells)
            _write_reports(into, sub)
            files[0].write_text(files[0].read_text() + _groups(sub))
    shutil.rmtree(into / ".cut", ignore_errors=True)
    return into


def _cut_from_pristine(tree: Path, sub, into: Path):
    """``sub`` with each PR's patch cut from the pristine source
    (``cut.cut``), written under ``into/.cut/`` (``stage`` removes it)."""
    scratch = into / ".cut"
    scratch.mkdir()
    files = cut.cut(tree, [pr.patch for pr in sub.prs], scratch)
    prs = tuple(
        dataclasses.replace(pr, patch=f)
        for pr, f in zip(sub.prs, files, strict=True)
    )
    return dataclasses.replace(sub, prs=prs)


def _copy_patches(staged: Path, patches: list[Path], n: int) -> list[Path]:
    """Copies ``patches`` (e.g. the repo-only ones) after the ``n`` already
    in ``staged``, named as ``git format-patch`` names them."""
    files = []
    for i, patch in enumerate(patches, start=n + 1):
        name = patchfile.format_patch_name(patchfile.parse_patch(patch).subject)
        f = staged / f"{i:04d}-{name}"
        f.write_text(
            patch.read_text().replace("\nSubject: ", "\nSubject: [PATCH] ", 1)
        )
        files.append(f)
    return files


def _finish(layout, base, files: list[Path], infos, cells) -> None:
    """Numbers every patch ``k/total``, strips the fork trailers, sets the
    author, writes each PR body beside its patch and the cover letter."""
    cover, patches = files[0], files[1:]
    total = len(patches)
    width = len(str(total))
    author = author_identity(layout.root)
    checked = pr_check_rows(layout, base)
    summaries = prbody.fix_summaries(layout)
    for k, (f, info, issue) in enumerate(
        zip(patches, infos, prbody.issue_lines(infos), strict=True), start=1
    ):
        text = re.sub(
            r"^Subject: \[PATCH[^\]]*\]",
            f"Subject: [PATCH {k:0{width}d}/{total}]",
            f.read_text(),
            count=1,
            flags=re.M,
        )
        if author:
            text = set_author(text, author)
        f.write_text(patchfile.strip_fork_trailers(text))
        f.with_suffix(".md").write_text(
            prbody.render_pr_body(
                info, base, cells, issue, checked.get(info.name), summaries
            )
        )
        _write_integration(cover.parent, f, info, base, cells, summaries)
    cover.write_text(_cover(base, infos, patches, author, bool(cells), width))


def _write_integration(
    series_dir: Path, patch: Path, info, base, cells, summaries
) -> None:
    """Writes the integration tests of ``patch``'s fixes, for the person
    who sends it, as ``integration/<patch's name>.md`` in ``series_dir``
    (``prbody.integration_notes``); nothing without any."""
    notes = prbody.integration_notes(info, base, cells, summaries)
    if notes:
        folder = series_dir / INTEGRATION_DIR
        folder.mkdir(exist_ok=True)
        (folder / patch.with_suffix(".md").name).write_text(notes)


def set_author(text: str, author: str) -> str:
    """``text`` (a ``git format-patch`` file) with ``author`` in its
    ``From:`` header.

    The header may be folded over several lines (RFC 5322: a line that
    starts with whitespace continues the one before; ``git format-patch``
    folds a long name and address): the whole header is replaced, so that
    ``git mailinfo`` reads ``author`` once.

    Args:
        text: the patch file's text.
        author: ``Name <email>``.

    Returns:
        The text with its first ``From:`` header replaced.
    """
    return re.sub(
        r"^From: .*(?:\n[ \t].*)*$",
        f"From: {author}",
        text,
        count=1,
        flags=re.M,
    )


def _write_reports(into: Path, sub) -> None:
    """Opens the body of each PR that fixes a bug report of ``issues/`` by
    naming it: the report is opened with the PR (at once, when the PR
    waits on a design issue), and the PR's ``Fixes`` line then names its
    number."""
    for issue in sub.bug_reports:
        pr = sub.fixed_by(issue)
        folder = into / "pending" if pr.after else into
        (body,) = folder.glob(f"{pr.number:04d}-*.md")
        line = (
            f"**Fixes** the bug report {issue.label}: {issue.title} "
            f"(`issues/{issue.path.name}`). Open it with this PR and write "
            "`Fixes #<its number>` under Description.\n\n"
        )
        text = body.read_text()
        # After the pending PR's own first line, which names its wait.
        at = text.index("\n\n") + 2 if pr.after else 0
        body.write_text(text[:at] + line + text[at:])


def _write_waiting(layout, base, into: Path, sub, cells) -> None:
    """Writes ``pending/`` (each PR that waits on a design issue, as
    ``NNNN-*.patch`` with its body, which opens by naming the issue) and
    ``issues/`` (each design issue, with what waits on it)."""
    checked = pr_check_rows(layout, base)
    summaries = prbody.fix_summaries(layout)
    author = author_identity(layout.root)
    if sub.pending:
        (into / "pending").mkdir()
    for pr in sub.pending:
        info = patchfile.parse_patch(pr.patch)
        f = _copy_patches(into / "pending", [pr.patch], pr.number - 1)[0]
        text = f.read_text()
        if author:
            text = set_author(text, author)
        f.write_text(patchfile.strip_fork_trailers(text))
        waits = (
            f"**Waits on** {pr.after.label}: {pr.after.title} "
            f"(`issues/{pr.after.path.name}`). Send it once the issue "
            "is answered, changed as the answer says.\n\n"
        )
        body = prbody.render_pr_body(
            info,
            base,
            cells,
            prbody.issue_lines([info])[0],
            checked.get(info.name),
            summaries,
        )
        f.with_suffix(".md").write_text(waits + body)
        _write_integration(into, f, info, base, cells, summaries)
    if sub.issues:
        (into / "issues").mkdir()
    for issue in sub.issues:
        # What waits on an issue is the cover letter's and submission.toml's
        # to say: the issue goes upstream as it is written.
        shutil.copyfile(issue.path, into / "issues" / issue.path.name)


def _fixer(sub, issue) -> str:
    """The number of the PR that fixes the bug report ``issue``, with the
    design issue it waits on, if any."""
    pr = sub.fixed_by(issue)
    return (
        f"{pr.number}, after {pr.after.label}" if pr.after else str(pr.number)
    )


def _waiters(sub, issue) -> list[str]:
    """What waits on ``issue``: the numbers of its PRs, ``carried`` for a
    carried patch."""
    out = [str(p.number) for p in sub.pending if p.after == issue]
    out += ["carried" for c in sub.carried if c.issue == issue]
    return out


def _groups(sub) -> str:
    """The cover letter's three groups: the PRs to send now, those that
    wait on a design issue, and what the fork's wheel carries beyond the
    PRs (``submission``)."""

    def subject(path):
        return patchfile.parse_patch(path).subject

    lines = ["", "Send now, in this order:"]
    lines += [f"  {p.number:2d}. {subject(p.patch)}" for p in sub.send_now]
    lines += [
        "",
        "Bug reports to open, each with the PR that fixes it (issues/):",
    ]
    lines += [
        f"  {i.label}: {i.title} (fixed by {_fixer(sub, i)})"
        for i in sub.bug_reports
    ] or ["  none"]
    lines += ["", "Design issues to open first (issues/):"]
    lines += [
        f"  {i.label}: {i.title} (waited on by "
        + (", ".join(_waiters(sub, i)) or "nothing in this series")
        + ")"
        for i in sub.design_issues
    ] or ["  none"]
    lines += ["", "After their design issue (pending/):"]
    lines += [
        f"  {p.number:2d}. {subject(p.patch)} (after {p.after.label})"
        for p in sub.pending
    ] or ["  none"]
    lines += ["", "Carried in the fork's wheel only, never sent as a PR:"]
    lines += [
        f"  - {subject(c.patch)} (waits on {c.waits_on})" for c in sub.carried
    ] or ["  none"]
    return "\n".join(lines) + "\n"


def author_identity(root: Path) -> str | None:
    """``Name <email>`` from the git configuration of the person building
    (``git config user.name`` / ``user.email`` in ``root``), or None when
    either is unset: the series' commits carry the fork's placeholder
    identity, which must not reach upstream (docs/sending-prs.md)."""
    values = []
    for key in ("user.name", "user.email"):
        values.append(
            process.run_git(root, "config", "--get", key).stdout.strip()
        )
    name, email = values
    return f"{name} <{email}>" if name and email else None


def diffstat(patches: list[Path]) -> str:
    """``git diff --stat``-like lines over all ``patches`` together (from
    ``git apply --numstat``, which needs no repository)."""
    added: dict[str, list[int]] = {}
    for patch in patches:
        for path, (plus, minus) in series.numstat(patch).items():
            row = added.setdefault(path, [0, 0])
            row[0] += plus
            row[1] += minus
    width = max((len(p) for p in added), default=0)
    lines = [
        f" {p:<{width}} | {a + d:5d} (+{a} -{d})"
        for p, (a, d) in sorted(added.items())
    ]
    ins = sum(a for a, _ in added.values())
    dels = sum(d for _, d in added.values())
    lines.append(
        f" {len(added)} files changed, {ins} insertions(+), {dels} deletions(-)"
    )
    return "\n".join(lines)


def _cover(base, infos, patches, author, proven: bool, width: int) -> str:
    """The cover letter, written whole: the counts, the list, the author
    summary and the diffstat all cover every patch of the series."""
    total = len(infos)
    subject = (
        f"[PATCH {0:0{width}d}/{total}] Distributed-training fixes for "
        f"Keras {base.version} ({total} patch{'es' if total > 1 else ''})"
    )
    links = prbody.issue_lines(infos)
    lines = [
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 "
        "2001",
        f"From: {author or 'NOT SET (git config user.name / user.email)'}",
        f"Subject: {subject}",
        "",
        "Targeted fixes for multi-device training, one per commit, each "
        "with its own unit tests.",
        "",
        *[
            f"- {i.subject}" + (f" ({link})" if link else "")
            for i, link in zip(infos, links, strict=True)
        ],
        "",
        *(
            [
                f"Integration test results: {INTEGRATION_DIR}/, one file a "
                "PR, for the person who sends it (not posted: a reviewer "
                "can neither see nor run them)",
                "",
            ]
            if proven
            else []
        ),
        f"{(author or 'author not set').split(' <')[0]} ({total}):",
        *[f"  {i.subject}" for i in infos],
        "",
        diffstat(patches),
        "",
    ]
    return "\n".join(lines)
