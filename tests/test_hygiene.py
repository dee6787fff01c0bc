"""The hygiene rules of a written PR series, on small synthetic files."""

from pathlib import Path

from keras_fork.upstream import hygiene

ADA = "Ada Lovelace <ada@example.org>"


def _patch_text(
    author: str = f"From: {ADA}", message: str = "Fix it\n\nBody.\n"
) -> str:
    """A ``git format-patch`` file of one commit: ``author`` as its
    ``From:`` header (folded where it holds a newline), ``message`` as its
    subject, blank line and body."""
    subject, _, body = message.partition("\n\n")
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00"
        " 2001\n"
        f"{author}\n"
        "Date: Fri, 27 Nov 2026 01:32:29 +0000\n"
        f"Subject: [PATCH 1/2] {subject}\n\n"
        f"{body}---\n"
        " a.py | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)\n\n"
        "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n"
        "@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    )


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_clean_author_passes(tmp_path):
    patch = _write(tmp_path / "0001-a.patch", _patch_text())
    assert hygiene.check_patch(patch, ADA) == []
    assert hygiene.check_patch(patch, None) == []


def test_a_folded_from_header_is_caught(tmp_path):
    """``git mailinfo`` unfolds the header (RFC 5322) and reads the right
    name and address, so only the raw header shows the fold: it is what
    ``set_author`` would have replaced, left as ``format-patch`` wrote
    it."""
    text = _patch_text("From: Ada Lovelace\n <ada@example.org>")
    headers, stray, _ = hygiene.mailinfo(text)
    assert ("Author", "Ada Lovelace") in headers and stray == []
    patch = _write(tmp_path / "0001-a.patch", text)
    for identity in (ADA, None):
        (problem,) = hygiene.check_patch(patch, identity)
        assert problem.startswith("From: header folded over 2 lines")


def test_a_half_replaced_header_reads_an_address_as_the_name(tmp_path):
    """A one-line replacement of the first line of a folded header leaves
    the old address below it: mailinfo then reads the new address as the
    name."""
    text = _patch_text(f"From: {ADA}\n <maintainers@users.noreply.example>")
    problems = hygiene.author_problems(text, ADA)
    assert any("folded over 2 lines" in p for p in problems)
    assert any("Author 'ada@example.org' holds" in p for p in problems)


def test_an_author_without_address_or_not_the_builder_is_caught():
    problems = hygiene.author_problems(_patch_text("From: Ada Lovelace"), None)
    assert any("Author: line(s) ['']" in p for p in problems)
    assert any("Email: line(s) ['']" in p for p in problems)
    (problem,) = hygiene.author_problems(_patch_text(), "Bo <bo@example.org>")
    assert problem.startswith(f"author {ADA} is not the builder's Bo")


def test_pr_numbers_and_the_fork_in_a_body_are_caught():
    body = (
        "## Description\n\n"
        "Like PR 7, this fixes the fork's loss.\n"
        "Upstream's #20410 and keras-team/keras#23046 stay; PRs alone too.\n"
        "Processes forked by torch, a wheel and what is carried: named.\n"
    )
    assert hygiene.markdown_problems(body, pr_body=True) == [
        "line 3: names an internal PR number and the fork ('PR 7', \"fork's\")",
        "line 5: names the fork ('wheel', 'carried')",
    ]


def test_html_comments_are_exempt_but_must_close():
    """A comment is a note to the submitter that GitHub does not show; one
    never closed hides the rest of the body."""
    body = (
        "Text.\n<!-- For the submitter: PR 7 of the fork,\n"
        "Fixes #12. Delete this. -->\nMore text.\n"
    )
    assert hygiene.markdown_problems(body, pr_body=True) == []
    open_ = "Text.\n\n<!-- a note\nthe fork, PR 7\n"
    assert hygiene.markdown_problems(open_, pr_body=True) == [
        "line 3: an HTML comment '<!--' never closed hides the rest of the file"
    ]


def test_fork_trailers_and_words_in_a_commit_message_are_caught(tmp_path):
    message = (
        "Fix it\n\nCarried since PR 3.\n\n"
        "Fork-Fix: loss-scale\nBug: 12\nSigned-off-by: Ada <ada@example.org>\n"
    )
    patch = _write(tmp_path / "0001-a.patch", _patch_text(message=message))
    assert hygiene.check_patch(patch, ADA) == [
        "commit message line 3: names the fork and an internal PR number "
        "('Carried', 'PR 3')",
        "commit message line 5: names the fork ('Fork-Fix:')",
        "commit message line 6: names the fork ('Bug:')",
    ]


def test_closing_references_other_than_the_two_forms_are_caught():
    body = (
        "Fixes keras-team/keras#1\n"
        "Open the report and write `Fixes #<its number>` here.\n"
        "Fixes #12\ncloses tensorflow/tensorflow#3\n"
        "Resolved: https://github.com/keras-team/keras/issues/4\n"
        "**Fixes** the bug report 01; related fixes applied.\n"
    )
    assert [ref for _, ref in hygiene.closing_references(body)] == [
        "Fixes keras-team/keras#1",
        "Fixes #<its number>",
        "Fixes #12",
        "closes tensorflow/tensorflow#3",
        "Resolved: https://github.com/keras-team/keras/issues/4",
    ]
    problems = hygiene.markdown_problems(body, pr_body=True)
    assert [p.split(":")[0] for p in problems] == ["line 3", "line 4", "line 5"]
    # An issue file closes nothing: its references are not checked.
    assert hygiene.markdown_problems(body, pr_body=False) == []


def test_a_series_is_read_with_its_bodies_and_issues_not_its_cover(tmp_path):
    folder = tmp_path / "pr-series" / "9.9.9"
    fork = _patch_text(message="Cover\n\nPR 7 and the fork's wheel.\n")
    cover = _write(folder / "0000-cover-letter.patch", fork)
    first = _write(folder / "0001-a.patch", _patch_text())
    _write(folder / "0001-a.md", "Fixes keras-team/keras#5\n")
    waiting = _write(folder / "pending/0002-b.patch", _patch_text())
    _write(folder / "pending/0002-b.md", "Waits on the issue. See PR 1.\n")
    lost = _write(folder / "pending/0003-c.patch", _patch_text())
    issue = _write(folder / "issues/01-x.md", "- PR 2: a change\n")
    report = hygiene.check_series(folder, [cover, first, waiting, lost], ADA)
    assert report.problems == [
        (
            waiting.with_suffix(".md"),
            "line 1: names an internal PR number ('PR 1')",
        ),
        (lost, "no PR body 0003-c.md beside it"),
        (issue, "line 1: names an internal PR number ('PR 2')"),
    ]
    assert report.fixes == {
        first: ["Fixes keras-team/keras#5"],
        waiting: [],
        lost: [],
    }
    assert report.of(first, first.with_suffix(".md")) == []
    assert len(report.of(waiting, waiting.with_suffix(".md"))) == 1
