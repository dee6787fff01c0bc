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
import subprocess
import tempfile
import tomllib
from pathlib import Path

from keras_fork import outputs
from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe import series
from keras_fork.recipe import submission
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout
from keras_fork.upstream import cut

# Upstream reviewers get numbered patches, a cover letter and a diffstat.
PR_FLAGS = (
    "--zero-commit",
    "--full-index",
    "--no-signature",
    "--numbered",
    "--cover-letter",
)
_FIXES_LINE = re.compile(r"^(Fixes|Refs) [\w./-]+#\d+\s*$")


# What each proof topology is, in the words of a PR body: a reviewer
# reads the setup, not the matrix's names for it.
SETUPS = {
    "1": "one device",
    "8": "8 devices, `DataParallel`",
    "procs-2": "2 JAX processes, `DataParallel`",
    "mirrored-2": "`MirroredStrategy`, 2 devices",
    "mirrored-4": "`MirroredStrategy`, 4 devices",
    "multiworker-2": "`MultiWorkerMirroredStrategy`, 2 workers",
    "ddp-2": "2 torch DDP processes (gloo)",
    "dp-2": "2 processes, `DataParallel` (gloo)",
    "unit": "the unit tests, one device",
}
# A proof verdict as a PR body states it.
RESULTS = {"proven": "fixed", "guard": "unchanged (regression check)"}


def pr_series_dir(layout: Layout, base: Base) -> Path:
    """Where the PR series of ``base`` is written:
    ``dist/pr-series/<version>/``."""
    return layout.dist / "pr-series" / base.version


def add_arguments(p) -> None:
    """The ``pr-series`` verb's options."""
    p.add_argument(
        "--base",
        action="append",
        help="only this base (repeatable; default: every pinned base)",
    )
    p.add_argument(
        "--sdist",
        type=Path,
        help="use this sdist instead of the cached or downloaded one "
        "(offline; needs exactly one --base; checked against the pinned "
        "sha256): scripts/build passes build's options on",
    )


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

    bases = pins.select_bases(layout, args.base)
    if args.sdist and len(bases) != 1:
        raise ForkError("--sdist needs exactly one --base")
    _remove_scratch(layout)
    for base in bases:
        sdist_lib.fetch(layout, base, args.sdist)
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
        return json.loads((layout.dist / "proof.json").read_text())["cells"]
    except (FileNotFoundError, KeyError, ValueError):
        return []


def pr_cells(layout: Layout, base: Base, cells: list[dict]) -> list[dict]:
    """The proof cells a PR body of ``base`` may report: those of fixes
    that no carried patch of ``base`` carries too. The integration tests
    run on the wheel, so a fix the wheel carries beyond its PR passes them
    with more than the PR (``submission``)."""
    sub = submission.read(layout, base)
    carried = {
        f for c in sub.carried for f in series.parse_patch(c.patch).fixes
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


def _master_lines(row: dict | None, base: Base) -> list[str]:
    """The body's section on the PR alone on a Keras checkout, from its
    ``pr-check`` row: each backend's added tests on the checkout's code and
    with the PR; none when it was not checked or did not apply."""
    if not row or not row.get("applies"):
        return []
    where = f"Keras at `{row['rev']}`"
    if row["source"] == "base":
        source = f"{base.package} {base.version}"
        where += f" (its test files, with the source of {source})"
    verdict = row.get("verdict", "-")
    outcome = {"proven": "they fail without its change and pass with it"}.get(
        verdict, f"without and with its change: {verdict}"
    )
    lines = [
        "### This PR alone on Keras master",
        "",
        f"Applied alone to {where}, the tests this PR adds: {outcome}.",
        "",
        "| backend | without | with |",
        "|---|---|---|",
    ]
    for backend in ("jax", "tensorflow", "torch"):
        if row.get(backend) not in (None, "-"):
            without = row.get(f"stock:{backend}", "-")
            lines.append(f"| {backend} | {without} | {row[backend]} |")
    return [*lines, ""]


def issue_lines(infos: list[series.PatchInfo]) -> list[str]:
    """The issue line of each PR body, in series order.

    ``Fixes <issue>`` closes the issue when GitHub merges the PR, so only
    the first patch whose commit says ``Fixes`` for an issue keeps it; the
    others, and every ``Refs`` line, say ``Refs <issue>`` (GitHub: "Linking
    a pull request to an issue"). A patch with neither line gets no issue
    line (an empty string).
    """
    closed, lines = set(), []
    for info in infos:
        issue = info.upstream_issue
        if not issue:
            lines.append("")
        elif info.closes and issue not in closed:
            closed.add(issue)
            lines.append(f"Fixes {issue}")
        else:
            lines.append(f"Refs {issue}")
    return lines


# Keras's pull request template: a Description, then the contributor
# agreement, whose boxes the person who sends the PR ticks.
# Keras's CONTRIBUTING.md (AI-Assisted Contribution Policy): a PR says
# that an AI agent was used, and a human author understands, tests and
# defends every line. Only that author can say what they checked and how:
# the section is left for them, marked, with nothing written in their name.
AI_ASSISTANCE = "\n".join(
    [
        "## AI assistance",
        "",
        "<!-- TO BE WRITTEN BY THE SUBMITTER, in your own words, before "
        "sending: that an AI coding agent prepared this change, its tests "
        "and this description with you; what you read and checked "
        "yourself; how and on which backends you ran the tests "
        "(CONTRIBUTING.md, AI-Assisted Contribution Policy). Then delete "
        "this comment. -->",
        "",
    ]
)
AGREEMENT = "\n".join(
    [
        "## Contributor Agreement",
        "",
        "- [ ] I am a human, and not a bot.",
        "- [ ] I will be responsible for responding to review comments in a "
        "timely manner.",
        "- [ ] I will work with the maintainers to push this PR forward until "
        "submission.",
        "- [ ] I have signed the Google Contributor License Agreement "
        "(submitter to confirm; the `cla/google` check verifies it).",
        "",
    ]
)


def fix_summaries(layout: Layout) -> dict[str, str]:
    """Each fix's one-line ``summary`` (its ``fix.toml``) by fix id: a body
    names a fix by what it checks, never by its id."""
    out = {}
    for path in sorted(layout.fixes.glob("*/fix.toml")):
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if "id" in doc and "summary" in doc:
            out[doc["id"]] = doc["summary"]
    return out


def _row(cells: list[str]) -> str:
    """A markdown table row (``|`` in a cell escaped)."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _where(run: list[dict]) -> str:
    """Where the cells ran: ``CPU``, ``GPU`` or ``CPU and GPU`` (each
    row's ``accelerator``; rows without one ran on CPU)."""
    kinds = {
        "CPU" if c.get("accelerator", "cpu") == "cpu" else "GPU" for c in run
    }
    return " and ".join(sorted(kinds))


def _proof_row(c: dict, several: bool, summaries: dict[str, str]) -> str:
    """One cell as a table row: what it checks (several fixes only), the
    backend, the setup, the outcome without (``*``: with prerequisites)
    and with the change, and the result."""
    prerequisites = c.get("stock_side", "stock").split("+")[1:]
    return _row(
        [
            *([summaries.get(c["fix"], c["fix"])] if several else []),
            c["backend"],
            SETUPS.get(c["topology"], c["topology"]),
            (c["stock"] or "-") + ("*" if prerequisites else ""),
            c["fork"] or "-",
            RESULTS.get(c["verdict"], c["verdict"]),
        ]
    )


def _proof_lines(
    info: series.PatchInfo,
    base: Base,
    cells: list[dict],
    summaries: dict[str, str] | None = None,
) -> list[str]:
    """The body's section on the integration tests: the proof cells of the
    patch's fixes that ran on ``base``, each setup without and with the
    change, and how many more do not apply; none without a run. Worded for
    a reviewer: setups described (``SETUPS``), verdicts as results
    (``RESULTS``), fixes by their summaries, never by the matrix's names."""
    rows = [
        c
        for c in cells
        if c.get("fix") in info.fixes and c["base"] == base.version
    ]
    run = [c for c in rows if c["verdict"] != "n/a"]
    if not run:
        return []
    summaries = summaries or {}
    several = len(info.fixes) > 1
    head = ["what it checks"] if several else []
    lines = [
        f"### Integration tests on {base.package} {base.version}",
        "",
        f"Integration tests of this change on {_where(run)}, without it "
        "and with it (this PR applied together with the related "
        "distributed-training PRs), in each setup they apply to, several "
        "devices and processes included.",
        "",
        _row([*head, "backend", "setup", "without", "with", "result"]),
        "|---" * (len(head) + 5) + "|",
        *[_proof_row(c, several, summaries) for c in run],
    ]
    needs = sorted(
        {n for c in run for n in c.get("stock_side", "stock").split("+")[1:]}
    )
    if needs:
        named = "; ".join(summaries.get(n, n) for n in needs)
        lines += [
            "",
            "\\*: without this change, but with what the test needs to "
            f"reach the defect: {named}.",
        ]
    if len(run) < len(rows):
        lines += [
            "",
            f"({len(rows) - len(run)} more backend and setup combinations "
            "do not apply to this change.)",
        ]
    return [*lines, ""]


# Paragraphs of a commit message that open a section of the PR body, by
# their label: "Repro (any backend):", "Behaviour changes:", "Cost: ...".
_LABELS = (
    (re.compile(r"Repro\b"), "Repro"),
    (re.compile(r"Behaviou?r changes?\b"), "Behaviour changes"),
    (re.compile(r"API changes?\b"), "API changes"),
    (re.compile(r"Cost\b"), "Cost"),
    (re.compile(r"Unchanged\b"), "Unchanged"),
    (re.compile(r"Tests\b"), "What the tests check"),
)
_LABEL = re.compile(r"^(?P<label>[A-Z][\w ]*?)(?P<note> \([^)\n]*\))?:\s*")


def _blocks(message: str) -> list[str]:
    """The paragraphs of ``message``, a fenced code block (which may hold
    blank lines) kept whole, without the ``Fixes``/``Refs`` line."""
    blocks, fence = [], None
    for part in message.split("\n\n"):
        if fence is not None:
            fence += "\n\n" + part
            if part.count("```") % 2:
                blocks.append(fence)
                fence = None
        elif part.count("```") % 2:
            fence = part
        elif not _FIXES_LINE.match(part):
            blocks.append(part)
    if fence is not None:
        blocks.append(fence)
    return blocks


def _label_of(block: str):
    """``(heading, rest of the paragraph)`` when ``block`` opens a labelled
    section, else None."""
    m = _LABEL.match(block)
    if not m:
        return None
    for pattern, heading in _LABELS:
        if pattern.fullmatch(m["label"]):
            rest = block[m.end() :]
            # A word, not a name such as `loss_test.py`.
            if re.match(r"[a-z]+(?=[\s,;:]|\.(\s|$))", rest):
                rest = rest[:1].upper() + rest[1:]
            return heading + (m["note"] or ""), rest
    return None


def description_sections(info: series.PatchInfo) -> list[str]:
    """The PR description from the commit message, as Markdown lines.

    Convention of the series' messages: the first paragraph states the
    problem (the description's opening, with what it announces by ending
    in a colon); a paragraph labelled ``Repro`` is followed by its code
    block; the other unlabelled paragraphs are the change
    (``### The fix``); ``Behaviour changes:``, ``API changes:``,
    ``Cost:``, ``Unchanged:`` and ``Tests:`` paragraphs each open a
    section of that heading, which runs to the next label. Keras's PR
    template asks for the what and why and for behaviour changes to be
    flagged (https://github.com/keras-team/keras/blob/master/
    .github/PULL_REQUEST_TEMPLATE.md).
    """
    blocks = _blocks(info.message) or [info.subject]
    out = [blocks[0]]
    section, fixed = "problem", False
    for prev, block in zip(blocks, blocks[1:]):
        labelled = _label_of(block)
        if prev.rstrip().endswith(":") and not labelled:
            out += ["", block]  # announced by the paragraph before it
            continue
        if labelled:
            heading, rest = labelled
            section = "repro" if heading.startswith("Repro") else "other"
            out += ["", f"### {heading}"]
            if rest:
                out += ["", rest]
            continue
        is_code = block.lstrip().startswith("```")
        if not fixed and (
            section == "problem" or (section == "repro" and not is_code)
        ):
            out += ["", "### The fix"]
            section, fixed = "fix", True
        out += ["", block]
    return out


def render_pr_body(
    info: series.PatchInfo,
    base: Base,
    cells: list[dict],
    issue: str = "",
    master: dict | None = None,
    summaries: dict[str, str] | None = None,
) -> str:
    """Markdown PR body in Keras's template: the description (problem,
    change, issue line), the unit tests the patch adds, the proof cells of
    its fix when a proof run exists (none: no integration test section,
    and nothing about it in the cover letter), the disclosure of AI
    assistance that Keras's contribution policy asks for, and the
    contributor agreement (boxes left for the person who submits, the
    Google CLA among them).

    Args:
        info: the patch.
        base: the base the series is on.
        cells: ``dist/proof.json``'s cells (may be empty).
        issue: the patch's line from ``issue_lines``.
        master: the patch's ``pr-check`` row (``pr_check_rows``), or None.
        summaries: ``fix_summaries``, to name the fixes of a patch that
            carries several.
    """
    lines = ["## Description", "", *description_sections(info), ""]
    if issue:
        lines += [issue, ""]
    lines += ["### Tests", ""]
    tests = sorted(set(info.added_tests()), key=info.added_tests().index)
    lines += [f"- `{t}`" for t in tests] or ["- (this patch adds no unit test)"]
    lines.append("")
    lines += _master_lines(master, base)
    lines += _proof_lines(info, base, cells, summaries)
    return "\n".join(lines) + "\n" + AI_ASSISTANCE + "\n" + AGREEMENT


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
    infos = [series.parse_patch(p) for p in chain]
    repo_only = series.read_repo_only(layout, base)
    cells = pr_cells(layout, base, proof_cells(layout))
    if infos:  # an empty series has nothing to send, not even a cover
        if base.sdist_tests:
            files = series.format_patch(tree, into, PR_FLAGS)
        else:  # the tree lacks the test hunks: send the patches
            files = [into / "0000-cover-letter.patch"]
            files += _copy_patches(into, chain, 0)
        files += _copy_patches(into, repo_only, len(infos))
        infos += [series.parse_patch(p) for p in repo_only]
        _finish(layout, base, files, infos, cells)
        if not base.sdist_tests:
            _write_waiting(layout, base, into, sub, cells)
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
        name = series.format_patch_name(series.parse_patch(patch).subject)
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
    summaries = fix_summaries(layout)
    for k, (f, info, issue) in enumerate(
        zip(patches, infos, issue_lines(infos), strict=True), start=1
    ):
        text = re.sub(
            r"^Subject: \[PATCH[^\]]*\]",
            f"Subject: [PATCH {k:0{width}d}/{total}]",
            f.read_text(),
            count=1,
            flags=re.M,
        )
        if author:
            text = re.sub(r"^From: .*$", f"From: {author}", text, 1, re.M)
        f.write_text(series.strip_fork_trailers(text))
        f.with_suffix(".md").write_text(
            render_pr_body(
                info, base, cells, issue, checked.get(info.name), summaries
            )
        )
    cover.write_text(_cover(base, infos, patches, author, bool(cells), width))


def _write_waiting(layout, base, into: Path, sub, cells) -> None:
    """Writes ``pending/`` (each PR that waits on a design issue, as
    ``NNNN-*.patch`` with its body, which opens by naming the issue) and
    ``issues/`` (each design issue, with what waits on it)."""
    checked = pr_check_rows(layout, base)
    summaries = fix_summaries(layout)
    author = author_identity(layout.root)
    if sub.pending:
        (into / "pending").mkdir()
    for pr in sub.pending:
        info = series.parse_patch(pr.patch)
        f = _copy_patches(into / "pending", [pr.patch], pr.number - 1)[0]
        text = f.read_text()
        if author:
            text = re.sub(r"^From: .*$", f"From: {author}", text, 1, re.M)
        f.write_text(series.strip_fork_trailers(text))
        waits = (
            f"**Waits on** {pr.after.label}: {pr.after.title} "
            f"(`issues/{pr.after.path.name}`). Send it once the issue "
            "is answered, changed as the answer says.\n\n"
        )
        body = render_pr_body(
            info,
            base,
            cells,
            issue_lines([info])[0],
            checked.get(info.name),
            summaries,
        )
        f.with_suffix(".md").write_text(waits + body)
    if sub.issues:
        (into / "issues").mkdir()
    for issue in sub.issues:
        waiting = sub.waiting_on(issue) or ["nothing in this series"]
        text = issue.path.read_text().rstrip("\n")
        text += "\n\n### Waiting on this issue\n\n"
        text += "".join(f"- {w}\n" for w in waiting)
        (into / "issues" / issue.path.name).write_text(text)


def _groups(sub) -> str:
    """The cover letter's three groups: the PRs to send now, those that
    wait on a design issue, and what the fork's wheel carries beyond the
    PRs (``submission``)."""

    def subject(path):
        return series.parse_patch(path).subject

    lines = ["", "Send now, in this order:"]
    lines += [f"  {p.number:2d}. {subject(p.patch)}" for p in sub.send_now]
    lines += ["", "Design issues to open first (issues/):"]
    lines += [f"  {i.label}: {i.title}" for i in sub.issues] or ["  none"]
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
    identity, which must not reach upstream (issue 23)."""
    values = []
    for key in ("user.name", "user.email"):
        proc = subprocess.run(
            ["git", "-C", str(root), "config", "--get", key],
            capture_output=True,
            text=True,
        )
        values.append(proc.stdout.strip())
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
    links = issue_lines(infos)
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
        *(["Integration test results: in each PR body", ""] if proven else []),
        f"{(author or 'author not set').split(' <')[0]} ({total}):",
        *[f"  {i.subject}" for i in infos],
        "",
        diffstat(patches),
        "",
    ]
    return "\n".join(lines)
