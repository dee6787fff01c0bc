"""The body of each PR of a series: the sections of its commit message, its
issue line, the proof's rows for the fixes it carries, and the sections
left to the submitter (AI assistance, Keras's contributor agreement).
"""

from __future__ import annotations

import re
import tomllib

from keras_fork.recipe import patchfile
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout

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


def _master_lines(row: dict | None, base: Base) -> list[str]:
    """The body's section on the PR alone on a Keras checkout, from its
    ``pr-check`` row: each backend's added tests on the checkout's code and
    with the PR. None unless that row shows them failing without the PR and
    passing with it (``proven``): any other row says more about the
    checkout or the harness than about the PR, and is the sender's to
    resolve, not the reviewer's to read."""
    if not row or not row.get("applies") or row.get("verdict") != "proven":
        return []
    where = f"Keras at `{row['rev']}`"
    if row["source"] == "base":
        source = f"{base.package} {base.version}"
        where += f" (its test files, with the source of {source})"
    outcome = (
        "with its change every one passes; without it at least one fails "
        "(one that passes either way guards behaviour the PR keeps)"
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


def issue_lines(infos: list[patchfile.PatchInfo]) -> list[str]:
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
    info: patchfile.PatchInfo,
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


def description_sections(info: patchfile.PatchInfo) -> list[str]:
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
    info: patchfile.PatchInfo,
    base: Base,
    cells: list[dict],
    issue: str = "",
    master: dict | None = None,
    summaries: dict[str, str] | None = None,
) -> str:
    """Markdown PR body in Keras's template: the description (problem,
    change, issue line), the unit tests the patch adds, the disclosure of
    AI assistance that Keras's contribution policy asks for, and the
    contributor agreement (boxes left for the person who submits, the
    Google CLA among them). The integration tests of its fix are not in
    the body, where a reviewer could neither see nor run them
    (``integration_notes``: beside it, for the submitter).

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
    return "\n".join(lines) + "\n" + AI_ASSISTANCE + "\n" + AGREEMENT


def integration_notes(
    info: patchfile.PatchInfo,
    base: Base,
    cells: list[dict],
    summaries: dict[str, str] | None = None,
) -> str:
    """The integration tests of the patch's fixes on ``base`` (its proof
    cells, in a reviewer's words), for the person who sends the PR: what
    to say when a reviewer asks how it was tested beyond its unit tests.
    Empty without a proof run that covers the patch.
    """
    lines = _proof_lines(info, base, cells, summaries)
    return "\n".join(lines) + "\n" if lines else ""
