"""pr-tests: a chain's test hunks rewritten to apply alone on a checkout."""

from pathlib import Path

import pytest

from keras_fork.errors import ForkError
from keras_fork.recipe import series
from keras_fork.upstream import checkout
from keras_fork.upstream import prtests

TEST = "class T:\n    def test_a(self):\n        pass\n"
T1 = "\n    def test_one(self):\n        pass\n"
T2 = "\n    def test_two(self):\n        pass\n"


def _lines(text: str) -> list[str]:
    return text.splitlines(True)


def test_a_test_appended_after_an_earlier_patch_s_goes_after_upstream_s():
    pristine, before = _lines(TEST), _lines(TEST + T1)
    after = _lines(TEST + T1 + T2)
    assert "".join(prtests.alone_lines(pristine, before, after)) == TEST + T2
    # A change to upstream's own lines is carried over too.
    edited = _lines(TEST.replace("test_a", "test_b") + T1 + T2)
    assert "".join(prtests.alone_lines(pristine, before, edited)) == (
        TEST.replace("test_a", "test_b") + T2
    )


def test_a_patch_that_edits_an_earlier_patch_s_test_cannot_go_alone():
    before = _lines(TEST + T1)
    after = _lines(TEST + T1.replace("pass", "return"))
    with pytest.raises(ForkError, match="an earlier patch added"):
        prtests.alone_lines(_lines(TEST), before, after)


def _chain(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A checkout with one test file, and two patches made as a chain on
    it, each appending a test to the same class."""
    repo = tmp_path / "keras-repo"
    (repo / "keras/src").mkdir(parents=True)
    (repo / "keras/src/a_test.py").write_text(TEST)
    env = series.git_env(0)
    series.git(repo, "init", "-q", "-b", "master", env=env)
    series.git(repo, "add", "-A", env=env)
    series.git(repo, "commit", "-qm", "upstream", env=env)
    series.git(repo, "checkout", "-q", "-b", "chain", env=env)
    for name, body in (("one", TEST + T1), ("two", TEST + T1 + T2)):
        (repo / "keras/src/a_test.py").write_text(body)
        series.git(repo, "commit", "-qam", f"Add test_{name}", env=env)
    patches = []
    for i, name in enumerate(("one", "two")):
        out = tmp_path / f"{name}.patch"
        rev = f"chain~{1 - i}"
        out.write_text(
            series.git(repo, "format-patch", "--stdout", "-1", rev, env=env)
        )
        patches.append(out)
    series.git(repo, "checkout", "-q", "master", env=env)
    return repo, patches


def test_rewrite_makes_each_patch_apply_alone_and_is_idempotent(tmp_path):
    repo, patches = _chain(tmp_path)
    with checkout.worktree(repo, "master") as (tree, commit):
        assert checkout.git(
            tree, "apply", "--check", str(patches[1])
        ).returncode
        new = prtests.rewrite(tree, commit, patches)
        assert list(new) == [patches[1]]  # the first applies alone already
        patches[1].write_text(new[patches[1]])
        for patch in patches:
            checkout.reset(tree, commit)
            assert checkout.git(tree, "apply", str(patch)).returncode == 0
        assert (tree / "keras/src/a_test.py").read_text() == TEST + T2
        # The message is kept; a second rewrite changes nothing.
        assert new[patches[1]].count("Subject: [PATCH] Add test_two") == 1
        assert prtests.rewrite(tree, commit, patches) == {}
