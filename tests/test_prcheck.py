"""pr-check: each PR alone on a Keras git checkout (a fake one here)."""

import argparse
import json
from pathlib import Path

import pytest

from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe import series
from keras_fork.upstream import prcheck

SOURCE = (
    "def order(n):\n    return list(range(n))\n\n\n\n\n\n"
    "def other():\n    return 0\n"
)
TEST = (
    "from keras.src.shuffle import order\n\n\n"
    "def test_order():\n    assert order(2) == [0, 1]\n"
)


def _repo(tmp_path: Path) -> Path:
    """A git checkout with a ``keras`` package, a module and its test."""
    repo = tmp_path / "keras-repo"
    (repo / "keras/src").mkdir(parents=True)
    (repo / "keras/__init__.py").write_text("")
    (repo / "keras/src/__init__.py").write_text("")
    (repo / "keras/src/shuffle.py").write_text(SOURCE)
    (repo / "keras/src/shuffle_test.py").write_text(TEST)
    env = series.git_env(0)
    series.git(repo, "init", "-q", "-b", "master", env=env)
    series.git(repo, "add", "-A", env=env)
    series.git(repo, "commit", "-qm", "upstream", env=env)
    return repo


def _patch(repo: Path, tmp_path: Path, name: str, source: str, test: str):
    """A format-patch file of one commit changing the module and its test
    (made on a scratch branch, which is then dropped)."""
    env = series.git_env(0)
    series.git(repo, "checkout", "-q", "-b", name, env=env)
    (repo / "keras/src/shuffle.py").write_text(source)
    (repo / "keras/src/shuffle_test.py").write_text(test)
    series.git(repo, "commit", "-qam", f"Change {name}", env=env)
    out = tmp_path / f"{name}.patch"
    out.write_text(series.git(repo, "format-patch", "--stdout", "-1", env=env))
    series.git(repo, "checkout", "-q", "master", env=env)
    series.git(repo, "branch", "-qD", name, env=env)
    return out


def test_each_pr_applies_alone_and_runs_its_added_tests(tmp_path):
    repo = _repo(tmp_path)
    good = _patch(
        repo,
        tmp_path,
        "reverse",
        SOURCE.replace("list(range(n))", "list(range(n))[::-1]"),
        TEST.replace("[0, 1]", "[1, 0]")
        + "\n\ndef test_reversed():\n    assert order(3)[0] == 2\n",
    )
    broken = _patch(
        repo,
        tmp_path,
        "broken",
        SOURCE.replace("range(n)", "range(n + 1)"),
        TEST + "\n\ndef test_longer():\n    assert order(2) == [0, 1]\n",
    )
    vacuous = _patch(
        repo,
        tmp_path,
        "vacuous",
        SOURCE.replace("range(n)", "range(0, n)"),
        TEST + "\n\ndef test_again():\n    assert order(1) == [0]\n",
    )
    # Upstream moves on: a patch made on the old code no longer applies.
    stale = _patch(
        repo, tmp_path, "stale", SOURCE.replace("return 0", "return 2"), TEST
    )
    (repo / "keras/src/shuffle.py").write_text(
        SOURCE.replace("return 0", "return 1")
    )
    series.git(repo, "commit", "-qam", "upstream moves", env=series.git_env(0))
    rows = prcheck.check(
        repo, "master", [good, broken, vacuous, stale], ("torch",)
    )
    by_name = {r["patch"]: r for r in rows}
    assert by_name["reverse.patch"]["applies"]
    assert by_name["reverse.patch"]["torch"] == "pass"
    # Its tests on the checkout's own code: they fail there.
    assert by_name["reverse.patch"]["stock:torch"] == "fail"
    assert by_name["reverse.patch"]["verdict"] == "proven"
    assert by_name["broken.patch"]["torch"] == "fail"
    assert by_name["broken.patch"]["verdict"] == "broken"
    # A test that passes without the change proves nothing.
    assert by_name["vacuous.patch"]["stock:torch"] == "pass"
    assert by_name["vacuous.patch"]["verdict"] == "vacuous"
    assert not by_name["stale.patch"]["applies"]
    assert by_name["stale.patch"]["verdict"] == "-"
    assert "keras/src/shuffle.py" in by_name["stale.patch"]["error"]
    # The checkout is left as it was.
    assert series.git(repo, "status", "--porcelain") == ""
    assert series.git(repo, "worktree", "list").count("\n") == 1


def test_an_unknown_revision_is_a_clear_error(tmp_path):
    with pytest.raises(ForkError, match="revision v9"):
        prcheck.check(_repo(tmp_path), "v9", [], ("torch",))


def test_pr_selects_by_name_or_submission_number(tmp_path):
    patches = [tmp_path / f"{n}.patch" for n in ("a", "b", "c")]
    assert prcheck.select_prs(patches, None) == patches
    chosen = prcheck.select_prs(patches, ["c.patch", "1"])
    assert chosen == [patches[0], patches[2]]
    with pytest.raises(ForkError, match="unknown --pr '4'"):
        prcheck.select_prs(patches, ["4"])


def test_a_partial_run_keeps_the_other_prs_rows_of_the_same_checkout(
    tmp_path,
):
    patches = [tmp_path / f"{n}.patch" for n in ("a", "b", "c")]
    last = tmp_path / "pr-check.json"
    old = [{"patch": f"{n}.patch", "verdict": "old"} for n in ("a", "b", "c")]
    last.write_text(json.dumps({"rev": "m", "source": "base", "rows": old}))
    args = argparse.Namespace(rev="m", source="base")
    new = [{"patch": "b.patch", "verdict": "proven"}]
    merged = prcheck._with_previous_rows(last, args, patches, new)
    assert [r["verdict"] for r in merged] == ["old", "proven", "old"]
    args = argparse.Namespace(rev="other", source="base")
    assert prcheck._with_previous_rows(last, args, patches, new) == new


def test_a_pass_that_selects_no_test_does_not_fail_the_pr(monkeypatch):
    """Keras's 8-device pass (``-m multi_device``) of a test file whose
    added tests are not ``multi_device`` selects none of them: pytest
    exits 5 there, which says nothing about the PR."""
    passes = [("jax", {}, []), ("jax, 8 devices", {}, ["-m", "x"])]
    monkeypatch.setattr(prcheck.kerastests, "passes", lambda *a: passes)
    monkeypatch.setattr(
        prcheck.kerastests, "touched_test_files", lambda p: ["k/a_test.py"]
    )
    monkeypatch.setattr(
        prcheck.kerastests, "added_test_selection", lambda *a: "t"
    )
    outcomes = iter([(0, "1 passed in 1s"), (5, "1 deselected in 0s")])
    monkeypatch.setattr(
        prcheck.kerastests, "run_pytest", lambda *a: next(outcomes)
    )
    out = prcheck.run_tests(Path("."), Path("p.patch"), ("jax",))
    assert out["jax"] == "pass"
    outcomes = iter([(5, "1 deselected"), (5, "1 deselected")])
    out = prcheck.run_tests(Path("."), Path("p.patch"), ("jax",))
    assert out["jax"] == "-"


def test_in_order_applies_each_pr_on_the_ones_before_it(tmp_path):
    """PRs that add tests at different places of one file apply in order;
    one that adds at the same place as an earlier PR conflicts there (as
    `git am -3` does for a maintainer), is named with the file, and the
    next PR still goes on."""
    repo = _repo(tmp_path)
    end = _patch(
        repo,
        tmp_path,
        "end",
        SOURCE,
        TEST + "\n\ndef test_end():\n    assert order(0) == []\n",
    )
    same_spot = _patch(
        repo,
        tmp_path,
        "same-spot",
        SOURCE,
        TEST + "\n\ndef test_end_too():\n    assert order(1) == [0]\n",
    )
    top = _patch(
        repo,
        tmp_path,
        "top",
        SOURCE.replace("return 0", "return 1"),
        "import math\n" + TEST,
    )
    with prcheck.checkout.worktree(repo, "master") as (tree, _):
        rows = prcheck.in_order(tree, [end, same_spot, top])
        text = (tree / "keras/src/shuffle_test.py").read_text()
    assert [r["applies"] for r in rows] == [True, False, True]
    assert "keras/src/shuffle_test.py" in rows[1]["error"]
    assert "CONFLICT" in rows[1]["error"]
    assert text.startswith("import math\n") and "test_end()" in text
    assert "test_end_too" not in text


def test_in_order_needs_a_written_series(tmp_path):
    layout = pins.Layout.default(tmp_path)
    base = argparse.Namespace(version="9.9.9")
    with pytest.raises(ForkError, match="no PR in"):
        prcheck.series_files(layout, base)


def test_lint_reads_what_the_series_changed_under_the_checkouts_config(
    tmp_path,
):
    """The merged series is linted with the checkout's own ruff settings
    (here: line length 40), on the files it changed only."""
    repo = _repo(tmp_path)
    (repo / "pyproject.toml").write_text("[tool.ruff]\nline-length = 40\n")
    env = series.git_env(0)
    series.git(repo, "add", "-A", env=env)
    series.git(repo, "commit", "-qm", "config", env=env)
    formatted = "def order(n):\n    return list(range(n))\n"
    long_line = _patch(
        repo,
        tmp_path,
        "long",
        formatted + "\n\nX = 'a string that is longer than forty'\n",
        TEST,
    )
    short = _patch(repo, tmp_path, "short", formatted, TEST)
    for patch, clean in ((short, True), (long_line, False)):
        with prcheck.checkout.worktree(repo, "master") as (tree, commit):
            prcheck.in_order(tree, [patch])
            problems = prcheck.lint(tree, commit)
        assert (problems == []) is clean, problems
    assert any("shuffle.py" in line for line in problems)


def test_in_order_fails_on_a_hygiene_problem_and_names_its_file(
    tmp_path, monkeypatch, capsys
):
    """``--in-order`` reads the written series' files too: a PR body that
    names an internal PR number makes it exit 1 with a line naming the
    body, though every PR applies and lints clean; each body's closing
    references are listed."""
    repo = _repo(tmp_path)
    env = series.git_env(0)
    (repo / "pyproject.toml").write_text("[tool.ruff]\n")
    series.git(repo, "add", "-A", env=env)
    series.git(repo, "commit", "-qm", "config", env=env)
    layout = pins.Layout.default(tmp_path / "fork")
    folder = layout.dist / "pr-series" / "9.9.9"
    folder.mkdir(parents=True)
    # Two PRs, the second made on the first, as the series is written.
    test_file = repo / "keras/src/shuffle_test.py"
    for name, test in (
        ("0001-end", "\n\ndef test_end():\n    assert order(0) == []\n"),
        ("0002-one", "\n\ndef test_one():\n    assert order(1) == [0]\n"),
    ):
        test_file.write_text(test_file.read_text() + test)
        series.git(repo, "commit", "-qam", f"Add {name}", env=env)
        (folder / f"{name}.patch").write_text(
            series.git(repo, "format-patch", "--stdout", "-1", env=env)
        )
    series.git(repo, "reset", "-q", "--hard", "HEAD~2", env=env)
    (folder / "0001-end.md").write_text("Fixes keras-team/keras#3\n")
    (folder / "0002-one.md").write_text("Follows PR 1 in the fork's wheel.\n")
    monkeypatch.setattr(
        prcheck.pins, "get_base", lambda *a: argparse.Namespace(version="9.9.9")
    )
    monkeypatch.setattr(prcheck.prseries, "author_identity", lambda root: None)
    args = argparse.Namespace(
        base="9.9.9",
        in_order=True,
        upstream_repo=repo,
        rev="master",
        source="checkout",
    )
    assert prcheck.main(args, layout) == 1
    out = capsys.readouterr().out
    # One line a problem, however long.
    line = (
        "0002-one.md: line 1: names an internal PR number and the fork "
        "('PR 1', \"fork's\", 'wheel')"
    )
    assert line in out.splitlines()
    assert "keras-team/keras#3" in out and "hygiene: 1 problem(s)" in out
    (folder / "0002-one.md").write_text("Follows the first.\n")
    assert prcheck.main(args, layout) == 0
    assert "hygiene: clean" in capsys.readouterr().out
