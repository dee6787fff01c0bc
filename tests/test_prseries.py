"""The PR series (``python -m keras_fork pr-series``) on a fake upstream:
its own stage, after ``build`` (wheels only) and after the proof.

These tests need no network and no real Keras; each builds a small fake
``keras-9.9.9`` sdist in a temporary folder.
"""

import dataclasses
import json
import re
import zipfile
from pathlib import Path

import pytest

from keras_fork import cli
from keras_fork.errors import ForkError
from keras_fork.proof import cells as cells_lib
from keras_fork.proof import fixes
from keras_fork.recipe import patchfile
from keras_fork.recipe import pins
from keras_fork.recipe import sdist
from keras_fork.recipe import series
from keras_fork.recipe import submission
from keras_fork.recipe import wheel
from keras_fork.upstream import hygiene
from keras_fork.upstream import prbody
from keras_fork.upstream import prseries
from tests import fake_upstream as fake


@pytest.fixture
def upstream(tmp_path):
    """(layout, base, sdist path outside the cache)."""
    return fake.make_upstream(tmp_path)


def _pr_series(layout, *args: str) -> Path:
    """Runs the ``pr-series`` verb on the fake layout; returns the fake
    base's folder ``dist/pr-series/9.9.9``."""
    assert cli.main(["--root", str(layout.root), "pr-series", *args]) == 0
    return layout.dist / "pr-series" / fake.VERSION


def test_a_pr_body_reports_its_pr_check_row(upstream):
    layout, base, _ = upstream
    fake.add_fix(layout, base, series.materialize(layout, base))
    (patch,) = series.read_series(layout, base)
    layout.dist.mkdir(parents=True, exist_ok=True)
    row = {
        "patch": patch.name,
        "applies": True,
        "error": None,
        "torch": "pass",
        "stock:torch": "fail",
        "jax": "-",
        "verdict": "proven",
    }
    (layout.dist / f"pr-check-{base.version}.json").write_text(
        json.dumps({"rev": "master", "source": "checkout", "rows": [row]})
    )
    out = _pr_series(layout)
    body = (out / "0001-Reverse-the-order.md").read_text()
    assert "### This PR alone on Keras master\n" in body
    assert (
        "Keras at `master`, the tests this PR adds: with its change every "
        "one passes; without it at least one fails" in body
    )
    assert "| torch | fail | pass |" in body and "| jax |" not in body


def test_pr_series_strips_fork_trailers_and_applies_to_pristine(
    upstream, tmp_path
):
    layout, base, archive = upstream
    fake.add_fix(layout, base, series.materialize(layout, base))
    out = _pr_series(layout)
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "0000-cover-letter.patch",
        "0001-Reverse-the-order.md",
        "0001-Reverse-the-order.patch",
    ]
    text = (out / "0001-Reverse-the-order.patch").read_text()
    for trailer in patchfile.FORK_TRAILERS:
        assert f"\n{trailer}: " not in text
    assert "Fixes keras-team/keras#1" in text
    body = (out / "0001-Reverse-the-order.md").read_text()
    assert "\nFixes keras-team/keras#1\n" in body
    assert body.startswith("## Description\n\nBecause tests want it.\n")
    # Keras's PR template: the agreement's boxes, unticked; no proof run,
    # no placeholder in the body: the cover letter says so.
    assert "## Contributor Agreement\n\n- [ ] I am a human" in body
    assert (
        "- [ ] I have signed the Google Contributor License Agreement" in body
    )
    assert "## AI assistance\n\n<!-- TO BE WRITTEN BY THE SUBMITTER" in body
    assert "I have read" not in body  # nothing said in their name
    assert body.index("## AI assistance") < body.index("## Contributor")
    assert "Proof" not in body and "scripts/" not in body
    assert "alone on Keras master" not in body  # no pr-check run
    cover = (out / "0000-cover-letter.patch").read_text()
    assert "Subject: [PATCH 0/1] " in cover and "proof" not in cover
    assert " 1 files changed, 1 insertions(+), 1 deletions(-)" in cover
    # git am onto a pristine unpack of the sdist.
    pristine = tmp_path / "pristine"
    sdist.unpack(archive, base, pristine)
    env = series.git_env(fake.EPOCH)
    series.git(pristine, "init", "-q", env=env)
    series.git(pristine, "add", "-A", env=env)
    series.git(pristine, "commit", "-qm", "pristine", env=env)
    series.git(pristine, "am", "-q", str(out / files[2]), env=env)
    assert "reversed" in (pristine / "keras/src/shuffle.py").read_text()


def _repo_only_patch(layout, base, tmp_path):
    """A fake upstream git repo (tag v9.9.9) with examples/demo.py, which the
    sdist lacks, and a repo-only patch for it in patches/9.9.9/repo-only."""
    upstream = tmp_path / "upstream-git"
    (upstream / "examples").mkdir(parents=True)
    (upstream / "examples/demo.py").write_text("step(training=None)\n")
    env = series.git_env(fake.EPOCH)
    series.git(upstream, "init", "-q", env=env)
    series.git(upstream, "add", "-A", env=env)
    series.git(upstream, "commit", "-qm", "upstream", env=env)
    series.git(upstream, "tag", f"v{fake.VERSION}", env=env)
    series.git(upstream, "tag", series.PRISTINE_TAG, env=env)
    (upstream / "examples/demo.py").write_text("step(training=True)\n")
    series.git(
        upstream,
        "commit",
        "-qam",
        "Fix the demo\n\nFixes keras-team/keras#2\n\nFork-Fix: reverse",
        env=env,
    )
    folder = series.series_dir(layout, base) / series.REPO_ONLY
    folder.mkdir()
    (made,) = series.format_patch(upstream, folder)
    name = re.sub(r"^\d{4}-", "", made.name)
    made.rename(folder / name)
    (folder / ".patches").write_text(name + "\n")
    series.git(upstream, "reset", "-q", "--hard", "HEAD~1", env=env)
    return upstream, name


def test_repo_only_patches_join_the_pr_series_but_not_the_wheel(
    upstream, tmp_path
):
    layout, base, _ = upstream
    tree = series.materialize(layout, base)
    fake.add_fix(layout, base, tree)
    repo, name = _repo_only_patch(layout, base, tmp_path)
    tree = series.materialize(layout, base)  # the repo-only patch is skipped
    assert not (tree / "examples").exists()
    assert series.check(layout, base, tree) == []
    series.export(tree, series.series_dir(layout, base))  # keeps repo-only
    assert [p.name for p in series.read_repo_only(layout, base)] == [name]
    out = _pr_series(layout)
    patches = sorted(p.name for p in out.glob("*.patch"))
    assert patches[2] == f"0002-{name}"
    text = (out / patches[2]).read_text()
    assert "Subject: [PATCH 2/2] Fix the demo" in text
    assert "Fork-Fix" not in text
    assert "[PATCH 1/2]" in (out / patches[1]).read_text()
    assert "[PATCH 0/2]" in (out / patches[0]).read_text()
    whl = wheel.build(layout, base, tree)
    with zipfile.ZipFile(whl) as z:
        manifest = json.loads(
            z.read("keras-9.9.9+fork.1.dist-info/FORK_PATCHES.json")
        )
    assert [p["name"] for p in manifest["patches"]] == [
        "Reverse-the-order.patch"
    ]
    assert series.check_repo_only(layout, base, repo) == []
    # Upstream moved on and the patch no longer applies: named.
    (repo / "examples/demo.py").write_text("other()\n")
    env = series.git_env(fake.EPOCH)
    series.git(repo, "commit", "-qam", "move", env=env)
    series.git(repo, "tag", "-f", f"v{fake.VERSION}", env=env)
    (failure,) = series.check_repo_only(layout, base, repo)
    assert failure.startswith(name) and "examples/demo.py" in failure


def test_fixes_is_claimed_once_per_issue_across_the_series():
    def info(subject, issue, closes):
        return patchfile.PatchInfo(
            subject, subject, subject, {}, issue, "", closes
        )

    infos = [
        info("a", "keras-team/keras#7", True),
        info("b", "keras-team/keras#7", True),
        info("c", "keras-team/keras#8", False),
        info("d", None, False),
    ]
    assert prbody.issue_lines(infos) == [
        "Fixes keras-team/keras#7",
        "Refs keras-team/keras#7",
        "Refs keras-team/keras#8",
        "",
    ]


def test_the_pr_author_is_the_builders_git_identity(upstream):
    layout, base, _ = upstream
    fake.add_fix(layout, base, series.materialize(layout, base))
    series.git(layout.root, "init", "-q")
    series.git(layout.root, "config", "user.name", "Ada Lovelace")
    series.git(layout.root, "config", "user.email", "ada@example.org")
    out = _pr_series(layout)
    patch = (out / "0001-Reverse-the-order.patch").read_text()
    assert "\nFrom: Ada Lovelace <ada@example.org>\n" in patch
    cover = (out / "0000-cover-letter.patch").read_text()
    assert "\nAda Lovelace (1):\n  Reverse the order\n" in cover


def test_a_folded_author_header_is_replaced_whole():
    """A long ``From:`` header that ``git format-patch`` folded over two
    lines is replaced whole: ``git mailinfo`` reads one name and one
    e-mail, the builder's."""
    text = (
        "From 0 Mon Sep 17 00:00:00 2001\n"
        "From: A very long name of the maintainers of a seed\n"
        " <maintainers@users.noreply.example>\n"
        "Date: Fri, 27 Nov 2026 01:32:29 +0000\n"
        "Subject: [PATCH] Fix it\n\nBody.\n---\n"
    )
    author = "Ada Lovelace <ada@example.org>"
    replaced = prseries.set_author(text, author)
    headers, _, _ = hygiene.mailinfo(replaced)
    assert ("Author", "Ada Lovelace") in headers
    assert ("Email", "ada@example.org") in headers
    assert hygiene.author_problems(replaced, author) == []
    assert "noreply" not in replaced


def test_pr_description_sections_follow_the_message_labels():
    """A commit message's labelled paragraphs become the PR body's
    headings: the problem opens the description, a Repro keeps its code
    block whole (blank lines and column-0 comments included), the change
    is "The fix", and behaviour changes and cost get their own."""
    message = "\n\n".join(
        [
            "Shuffling ignores the seed. Four defects:",
            "- one\n- two",
            "Repro (KERAS_BACKEND=jax):",
            "```python\nimport keras",
            "# master: the same order\nassert order(1) != order(2)\n```",
            "The order now comes from the seed.",
            "Behavior change: another order for a given seed.",
            "Cost: none.",
            "Fixes keras-team/keras#1",
        ]
    )
    info = patchfile.PatchInfo("p.patch", "Shuffle", message, {}, None, "")
    text = "\n".join(prbody.description_sections(info))
    assert [h for h in text.split("\n") if h.startswith("##")] == [
        "### Repro (KERAS_BACKEND=jax)",
        "### The fix",
        "### Behaviour changes",
        "### Cost",
    ]
    assert text.startswith("Shuffling ignores the seed. Four defects:\n\n- one")
    assert "import keras\n\n# master: the same order\nassert" in text
    assert "### Behaviour changes\n\nAnother order for a given seed." in text
    assert "### Cost\n\nNone." in text and "Fixes" not in text


def test_build_writes_wheels_only_and_pr_series_writes_the_series(upstream):
    """The PR series is its own stage: ``build`` leaves ``dist/pr-series``
    alone; ``pr-series`` writes it from ``patches/<V>`` through a tree of
    its own, leaving ``build/trees/<V>`` (where a fix is being edited) as
    it was."""
    layout, base, _ = upstream
    fake.add_fix(layout, base, series.materialize(layout, base))
    assert cli.main(["--root", str(layout.root), "build"]) == 0
    assert (layout.dist / base.wheel_name).is_file()
    assert not (layout.dist / "pr-series").exists()
    tree = layout.tree(base.version)
    (tree / "keras/src/shuffle.py").write_text("def order(n):\n    return []\n")
    env = series.git_env(fake.EPOCH)
    series.git(tree, "commit", "-qam", "Work in progress", env=env)
    head = series.git(tree, "rev-parse", "HEAD")
    out = _pr_series(layout)
    assert out == prseries.pr_series_dir(layout, base)
    assert sorted(p.name for p in out.iterdir()) == [
        "0000-cover-letter.patch",
        "0001-Reverse-the-order.md",
        "0001-Reverse-the-order.patch",
    ]
    assert series.git(tree, "rev-parse", "HEAD") == head
    assert not [p for p in layout.build.iterdir() if p.name.startswith(".")]
    assert not [p for p in layout.dist.rglob(".*")]


def _proof_cell(base, verdict, topology):
    return {
        "fix": "reverse",
        "base": base.version,
        "backend": "jax",
        "topology": topology,
        "stock": "fail" if verdict == "proven" else "-",
        "fork": "pass" if verdict == "proven" else "-",
        "verdict": verdict,
    }


def test_the_bodies_carry_the_proof_when_dist_has_one(upstream):
    """Without ``dist/proof.json`` neither the bodies nor the cover letter
    say anything about integration tests; after a proof run, ``pr-series``
    puts each patch's cells into its body, in a reviewer's words (setups
    described, no "stock", no topology names), and the cover letter points
    to them."""
    layout, base, _ = upstream
    fake.add_fix(layout, base, series.materialize(layout, base))
    out = _pr_series(layout)
    body = (out / "0001-Reverse-the-order.md").read_text()
    cover = (out / "0000-cover-letter.patch").read_text()
    for text in (body.lower(), cover.lower()):
        assert "proof" not in text and "integration test" not in text
    cells = [
        _proof_cell(base, "proven", "8"),
        _proof_cell(base, "n/a", "procs-2"),
        dict(_proof_cell(base, "proven", "1"), fix="another-fix"),
        dict(
            _proof_cell(base, "guard", "mirrored-2"),
            backend="tensorflow",
            stock_side="stock+other-fix",
            accelerator="gpu",
        ),
    ]
    (layout.dist / "proof.json").write_text(json.dumps({"cells": cells}))
    out = _pr_series(layout, "--base", base.version)
    # Not in the body a reviewer reads: beside it, for the submitter.
    assert (
        "integration test"
        not in (out / "0001-Reverse-the-order.md").read_text().lower()
    )
    body = (out / "integration" / "0001-Reverse-the-order.md").read_text()
    assert f"### Integration tests on keras {base.version}\n" in body
    assert "Integration tests of this change on CPU and GPU, without" in body
    assert "| jax | 8 devices, `DataParallel` | fail | pass | fixed |" in body
    assert (
        "| tensorflow | `MirroredStrategy`, 2 devices | -* | - | "
        "unchanged (regression check) |" in body
    )
    assert "\\*: without this change, but with what the test" in body
    assert "(1 more backend and setup combinations do not apply" in body
    assert "| jax | one device |" not in body  # another fix's cell
    assert not re.search(r"\bstock\b|mirrored-2|\bcells?\b", body, re.I)
    cover = (out / "0000-cover-letter.patch").read_text()
    assert "\nIntegration test results: integration/, one file a PR" in cover


def test_pr_series_of_an_empty_series_is_an_empty_folder(upstream):
    layout, base, _ = upstream
    out = _pr_series(layout)
    assert out.is_dir() and list(out.iterdir()) == []


MASTER = "3.16.0.dev2026102704"


def _master_matrix(layout) -> list[dict]:
    """The master base's real proof matrix as ``dist/proof.json`` rows,
    every cell run as declared (``proven``: fail, then pass): each
    topology and prerequisite a body may describe."""
    return [
        {
            "fix": c.fix,
            "base": c.base,
            "backend": c.backend,
            "topology": c.topology,
            "stock": "fail" if c.expect == "proven" else "pass",
            "fork": "pass",
            "verdict": c.expect,
            "stock_side": c.stock_side,
        }
        for c in cells_lib.load_matrix(layout.fixes)
        if c.base == MASTER
    ]


def test_master_pr_bodies_read_as_a_colleagues():
    """The bodies of the real master series, with its real proof matrix,
    say nothing in the fork's own words: no "stock" (they say master, or
    without this change), no topology name, Keras 3.15.1 only as the
    release it is. #20378, a closed keras.io guide issue, is only
    referenced, never "Fixes". Each body discloses AI assistance and
    leaves the CLA box to the submitter."""
    layout = pins.Layout.default()
    (base,) = pins.select_bases(layout, [MASTER])
    infos = [patchfile.parse_patch(p) for p in series.read_series(layout, base)]
    assert infos, "the master series is empty"
    cells = prseries.pr_cells(layout, base, _master_matrix(layout))
    summaries = prbody.fix_summaries(layout)
    names = {c["topology"] for c in cells} - {"1", "8"}
    issues = prbody.issue_lines(infos)
    for info, issue in zip(infos, issues, strict=True):
        body = prbody.render_pr_body(info, base, cells, issue, None, summaries)
        runs = [c for c in cells if c["fix"] in info.fixes]
        runs = [c for c in runs if c["verdict"] != "n/a"]
        # A PR with no running cell has no integration notes.
        notes = prbody.integration_notes(info, base, cells, summaries)
        assert bool(notes) == bool(runs), info.name
        assert "Integration tests" not in body, info.name
        body += notes
        assert not re.search(r"\bstock\b", body, re.I), info.name
        # A body stands alone: no other PR of the series by its number.
        assert not re.search(r"\bPRs? \d+", body), info.name
        assert not re.search(r"Fixes \S*#20378\b", body), info.name
        assert not [n for n in names if f"| {n} |" in body or f"`{n}`" in body]
        assert body.count("3.15.1") == body.count("Keras 3.15.1"), info.name
        assert (
            "\n## AI assistance\n\n<!-- TO BE WRITTEN BY THE SUBMITTER" in body
        )
        assert "- [ ] I have signed the Google Contributor License" in body
    # The docstring PR, and the warning carried on it: the integration
    # tests pass with the warning, so the PR's body reports none of them.
    ours = [i for i in infos if "stateless_call" in i.subject]
    assert ours
    assert not [c for c in cells if c["fix"] == "stateless-training"]
    for info in ours:
        assert issues[infos.index(info)] == "Refs keras-team/keras#20378"


def _series_folder(upstream, *names):
    layout, base, _ = upstream
    folder = series.series_dir(layout, base)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("")
    (folder / series.ORDER_FILE).write_text("".join(n + "\n" for n in names))
    return layout, base, folder


def test_submission_toml_splits_the_series_into_prs_and_carried(upstream):
    layout, base, folder = _series_folder(
        upstream, "a.patch", "b.patch", "c.patch", "d.patch", "e.patch"
    )
    # No submission.toml (a release base): every patch a PR, in order.
    sub = submission.read(layout, base)
    assert [p.patch.name for p in sub.send_now] == [
        "a.patch",
        "b.patch",
        "c.patch",
        "d.patch",
        "e.patch",
    ]
    (folder / "issues").mkdir()
    (folder / "issues" / "01-the-question.md").write_text("# The question\n")
    (folder / "issues" / "02-the-bug.md").write_text("# The bug\n")
    (folder / submission.SUBMISSION_FILE).write_text(
        '[[pr]]\npatch = "c.patch"\nverdict = "MERGE AS IS"\n'
        'reports = "the-bug"\n'
        '[[pr]]\npatch = "a.patch"\nafter = "the-question"\n'
        '[[carried]]\npatch = "b.patch"\nwhy = "waits"\n'
        'issue = "the-question"\n'
        '[[carried]]\npatch = "d.patch"\nwhy = "duplicate"\n'
        'upstream = "keras-team/keras#1"\n'
        '[[carried]]\npatch = "e.patch"\nwhy = "narrowed"\n'
        'follows = "c.patch"\n'
    )
    sub = submission.read(layout, base)
    assert [(p.number, p.patch.name) for p in sub.prs] == [
        (1, "c.patch"),
        (2, "a.patch"),
    ]
    assert [p.patch.name for p in sub.pending] == ["a.patch"]
    assert submission.read_submission(layout, base)[1].name == "a.patch"
    (issue,) = sub.design_issues
    assert (issue.label, issue.title) == ("issue 01", "The question")
    (bug,) = sub.bug_reports
    assert sub.fixed_by(bug) == sub.prs[0]
    assert sub.kind_of("b.patch") == sub.kind_of("d.patch") == "carried"
    assert [c.waits_on for c in sub.carried] == [
        "issue 01 (The question)",
        "keras-team/keras#1",
        "PR 1 (c.patch) merged first",
    ]


def test_submission_toml_names_every_problem(upstream):
    layout, base, folder = _series_folder(
        upstream, "a.patch", "b.patch", "d.patch"
    )
    (folder / "issues").mkdir()
    (folder / "issues" / "01-q.md").write_text("# Q\n")
    (folder / submission.SUBMISSION_FILE).write_text(
        '[[pr]]\npatch = "a.patch"\nafter = "q"\nreports = "q"\n'
        '[[pr]]\npatch = "x.patch"\nreports = "q"\n'
        '[[pr]]\npatch = "a.patch"\n'
        '[[carried]]\npatch = "c.patch"\nissue = "nowhere"\n'
        'upstream = "a PR"\n'
        '[[carried]]\npatch = "b.patch"\nwhy = "w"\nfollows = "b.patch"\n'
    )
    with pytest.raises(ForkError) as e:
        submission.read(layout, base)
    for problem in (
        "submission.toml:",
        "no design issue issues/NN-nowhere.md",
        "carried c.patch: no why",
        "carried c.patch: name one of issue, upstream, follows",
        "carried b.patch: follows b.patch, which is not a PR of the series",
        "carried c.patch: upstream is owner/repo#N",
        "not in .patches: x.patch",
        "listed twice: a.patch",
        "left out: d.patch",
        "a PR to send now follows one that waits on an issue",
        "issue 01: reported by two PRs",
        "issue 01: a bug report that something waits on",
    ):
        assert problem in str(e.value)


def _chain_blobs(tree: Path, patch: Path) -> list[str]:
    """The source files whose ``index`` line in ``patch`` names a blob
    other than the pristine source's (a blob of the series' chain)."""
    text = patch.read_text()
    pairs = re.findall(r"(?m)^diff --git a/(\S+) .*\nindex (\w+)\.\.", text)
    return [
        path
        for path, blob in pairs
        if not path.endswith("_test.py")
        and blob != series.git(tree, "rev-parse", f"pristine:{path}").strip()
    ]


def test_the_master_pr_series_sends_prs_and_never_a_carried_patch(
    tmp_path,
):
    """The real master series: the PRs to send now are numbered 1..k, the
    ones that wait go to pending/ with their numbers and the issue they
    wait on, every PR's source hunks are cut from the pristine source
    (their ``index`` lines name its blobs, not the chain's), every design
    issue lists what waits on it, the cover letter has the three groups,
    and no carried patch is a PR file."""
    layout = pins.Layout.default()
    (base,) = pins.select_bases(layout, [MASTER])
    sub = submission.read(layout, base)
    build = dataclasses.replace(layout, build=tmp_path / "build")
    tree = submission.checked_tree(build, base)
    out = prseries.stage(layout, base, tree, tmp_path / "series")
    numbered = sorted(p.name for p in out.glob("[0-9]*.patch"))
    assert len(numbered) == len(sub.send_now) + 1  # the cover letter
    pending = sorted(p.name for p in (out / "pending").glob("*.patch"))
    assert [int(n[:4]) for n in pending] == [p.number for p in sub.pending]
    for pr in sub.pending:
        (body,) = (out / "pending").glob(f"{pr.number:04d}-*.md")
        assert body.read_text().startswith(f"**Waits on** {pr.after.label}")
    subjects = [patchfile.parse_patch(c.patch).subject for c in sub.carried]
    names = [patchfile.format_patch_name(s) for s in subjects]
    assert not [n for n in names for f in numbered + pending if n in f]
    for issue in sub.issues:
        # An issue goes upstream as written: no numbering of this series,
        # no word of the fork.
        text = (out / "issues" / issue.path.name).read_text()
        assert text == issue.path.read_text()
        assert not re.search(r"\bPRs? \d|\bfork\b|\bwheel", text), issue
    for issue in sub.bug_reports:
        pr = sub.fixed_by(issue)
        folder = out / "pending" if pr.after else out
        (body,) = folder.glob(f"{pr.number:04d}-*.md")
        assert "**Fixes** the bug report" in body.read_text()
    for issue in sub.design_issues:
        assert any(p.after == issue for p in sub.pending) or any(
            c.issue == issue for c in sub.carried
        ), f"nothing waits on {issue.path.name}"
    for f in [*out.glob("[0-9]*.patch"), *out.glob("pending/*.patch")]:
        assert _chain_blobs(tree, f) == [], f.name
    cover = (out / "0000-cover-letter.patch").read_text()
    for heading in ("Send now", "Bug reports", "After their", "Carried"):
        assert heading in cover
    assert all(s in cover for s in subjects)


def test_the_docs_self_review_follows_submission_toml():
    """docs/upstream.md's self-review is generated from submission.toml
    (``fixes --readme``): one row a PR, numbered as the PR series is,
    the PRs to send now first."""
    layout = pins.Layout.default()
    (base,) = pins.select_bases(layout, [MASTER])
    sub = submission.read(layout, base)
    assert [p.number for p in sub.send_now] == list(
        range(1, len(sub.send_now) + 1)
    )
    docs = (layout.docs / "upstream.md").read_text()
    assert fixes.review_table(layout) in docs


def test_line_counts_split_keras_test_files_from_the_rest(tmp_path):
    diff = (
        "diff --git a/k/a.py b/k/a.py\n--- a/k/a.py\n+++ b/k/a.py\n"
        "@@ -1,2 +1,3 @@\n x\n-y\n+y2\n+z\n"
        "diff --git a/k/a_test.py b/k/a_test.py\n--- a/k/a_test.py\n"
        "+++ b/k/a_test.py\n@@ -1 +1,2 @@\n t\n+u\n"
    )
    patch = tmp_path / "p.patch"
    patch.write_text(diff)
    assert series.line_counts(patch) == {"source": (2, 1), "tests": (1, 0)}
