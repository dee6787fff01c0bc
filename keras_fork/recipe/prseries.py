"""The PR series: what maintainers read upstream.

``dist/pr-series/<version>/`` holds ``git format-patch`` files (numbered, with
a cover letter) that ``git am`` cleanly onto the pristine sdist tree, with the
fork-only trailers removed, and one markdown PR body a patch.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from keras_fork.recipe import series
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout

# Upstream reviewers get numbered patches, a cover letter and a diffstat.
PR_FLAGS = (
    "--zero-commit",
    "--full-index",
    "--no-signature",
    "--numbered",
    "--cover-letter",
)
_FIXES_LINE = re.compile(r"^Fixes [\w./-]+#\d+\s*$")
ISSUE_URL = "https://github.com/{repo}/issues/{num}"


def pr_series_dir(layout: Layout, base: Base) -> Path:
    return layout.dist / "pr-series" / base.version


def proof_cells(layout: Layout) -> list[dict]:
    """The cells of ``dist/proof.json`` (empty when the matrix never ran)."""
    try:
        return json.loads((layout.dist / "proof.json").read_text())["cells"]
    except (FileNotFoundError, KeyError, ValueError):
        return []


def _issue_link(issue: str | None) -> str:
    if not issue:
        return "(no upstream issue)"
    repo, num = issue.split("#")
    return f"[{issue}]({ISSUE_URL.format(repo=repo, num=num)})"


def render_pr_body(
    info: series.PatchInfo, base: Base, cells: list[dict]
) -> str:
    """Markdown PR body: problem, change, tests, proof rows of the fix."""
    # Commit-message convention of the series: the first paragraph states
    # the problem, the rest the change; the `Fixes` line becomes the link.
    paragraphs = [
        p for p in info.message.split("\n\n") if not _FIXES_LINE.match(p)
    ]
    problem = paragraphs[0] if paragraphs else info.subject
    change = "\n\n".join(paragraphs[1:]) or info.subject
    rows = [
        c
        for c in cells
        if c.get("fix") == info.fix and c["base"] == base.version
    ]
    lines = [
        f"# {info.subject}",
        "",
        "## Problem",
        "",
        problem,
        "",
        f"Upstream issue: {_issue_link(info.upstream_issue)} "
        f"(base: keras {base.version}).",
        "",
        "## Change",
        "",
        change,
        "",
        "## Tests",
        "",
    ]
    tests = info.added_tests()
    lines += [f"- `{t}`" for t in tests] or ["- (this patch adds no unit test)"]
    lines += [
        "",
        "## Proof (stock vs this patch, per backend and topology)",
        "",
    ]
    if rows:
        lines += [
            "| backend | topology | stock | fork | verdict |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {c['backend']} | {c['topology']} | {c['stock'] or '-'} | "
            f"{c['fork'] or '-'} | {c['verdict']}"
            + (f" ({c['reason']})" if c.get("reason") else "")
            + " |"
            for c in rows
        ]
    else:
        lines.append("Not measured yet: run `scripts/prove` and rebuild.")
    return "\n".join(lines) + "\n"


def write(layout: Layout, base: Base, tree: Path) -> Path:
    """Writes ``dist/pr-series/<version>/`` from the materialized ``tree``.

    The folder is replaced as a whole (staged beside it, then renamed).

    Returns:
        The folder.
    """
    dest = pr_series_dir(layout, base)
    dest.parent.mkdir(parents=True, exist_ok=True)
    infos = [series.parse_patch(p) for p in series.read_series(layout, base)]
    repo_only = series.read_repo_only(layout, base)
    cells = proof_cells(layout)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".pr.") as tmp:
        staged = Path(tmp) / "series"
        staged.mkdir()
        if infos:  # an empty series has nothing to send, not even a cover
            files = series.format_patch(tree, staged, PR_FLAGS)
            total = len(infos) + len(repo_only)
            for i, patch in enumerate(repo_only, start=len(infos) + 1):
                name = series.format_patch_name(
                    series.parse_patch(patch).subject
                )
                f = staged / f"{i:04d}-{name}"
                f.write_text(
                    patch.read_text().replace(
                        "\nSubject: ", f"\nSubject: [PATCH {i}/{total}] ", 1
                    )
                )
                files.append(f)
            infos += [series.parse_patch(p) for p in repo_only]
            cover, patches = files[0], files[1:]
            for f, info in zip(patches, infos, strict=True):
                text = re.sub(
                    r"^(Subject: \[PATCH \d+)/\d+\]",
                    rf"\1/{total}]",
                    f.read_text(),
                    count=1,
                    flags=re.M,
                )
                f.write_text(series.strip_fork_trailers(text))
                body = render_pr_body(info, base, cells)
                f.with_suffix(".md").write_text(body)
            cover.write_text(
                re.sub(
                    r"\[PATCH 0/\d+\]",
                    f"[PATCH 0/{total}]",
                    _cover(cover.read_text(), base, infos),
                    count=1,
                )
            )
        old = Path(tmp) / "old"
        if dest.exists():
            dest.rename(old)
        staged.rename(dest)
    return dest


def _cover(text: str, base: Base, infos: list[series.PatchInfo]) -> str:
    subject = (
        f"Distributed-training fixes for Keras {base.version} "
        f"({len(infos)} patch{'es' if len(infos) > 1 else ''})"
    )
    blurb = "\n".join(
        [
            "Targeted fixes for multi-device training, one per commit, each "
            "with its own unit tests.",
            "",
            *[
                f"- {i.subject} ({i.upstream_issue or 'no issue'})"
                for i in infos
            ],
        ]
    )
    text = text.replace("*** SUBJECT HERE ***", subject)
    return re.sub(r"\*\*\* BLURB HERE \*\*\*", lambda _: blurb, text)
