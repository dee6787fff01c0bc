"""Each PR cut from the pristine source (``keras_fork/upstream/cut.py``),
on a small git tree shaped as ``materialize`` leaves one."""

from pathlib import Path

import pytest

from keras_fork.errors import ForkError
from keras_fork.recipe import series
from keras_fork.upstream import cut

LINES = [f"line_{i} = {i}\n" for i in range(30)]


def _tree(tmp_path: Path, changes) -> tuple[Path, list[Path]]:
    """A tree tagged ``pristine`` with one commit per ``(subject, edit)``
    of ``changes`` (``edit`` maps the module's lines to new ones), and
    the commits exported as patches, the way ``export`` writes them."""
    tree = tmp_path / "tree"
    (tree / "keras").mkdir(parents=True)
    module = tree / "keras" / "module.py"
    module.write_text("".join(LINES))
    env = series.git_env(0)
    series.git(tree, "init", "-q", env=env)
    series.git(tree, "add", "-A", env=env)
    series.git(tree, "commit", "-qm", "pristine", env=env)
    series.git(tree, "tag", series.PRISTINE_TAG, env=env)
    for subject, edit in changes:
        module.write_text("".join(edit(module.read_text().splitlines(True))))
        series.git(tree, "commit", "-qam", subject, env=env)
    out = tmp_path / "patches"
    out.mkdir()
    return tree, series.format_patch(tree, out)


def _preimages(patch: Path) -> list[str]:
    return [
        line.split()[1].split("..")[0]
        for line in patch.read_text().splitlines()
        if line.startswith("index ")
    ]


def test_a_later_patch_is_cut_from_the_pristine_blob(tmp_path):
    tree, patches = _tree(
        tmp_path,
        [
            ("Change the top", lambda ls: ["top = 0\n", *ls]),
            ("Change the end", lambda ls: [*ls, "end = 0\n"]),
        ],
    )
    pristine = series.git(tree, "rev-parse", "pristine:keras/module.py")
    # As exported, the second patch names the blob the first one left.
    assert _preimages(patches[1]) != [pristine.strip()[:40]]
    out = tmp_path / "cut"
    out.mkdir()
    first, second = cut.cut(tree, patches, out)
    assert first.read_bytes() == patches[0].read_bytes()
    assert _preimages(second) == [pristine.strip()]
    assert "+end = 0" in second.read_text()
    assert "top = 0" not in second.read_text()


def test_a_patch_that_needs_an_earlier_one_is_named(tmp_path):
    tree, patches = _tree(
        tmp_path,
        [
            ("Add a line", lambda ls: [*ls, "added = 1\n"]),
            ("Change it", lambda ls: [*ls[:-1], "added = 2\n"]),
        ],
    )
    out = tmp_path / "cut"
    out.mkdir()
    with pytest.raises(ForkError, match="Change-it.patch does not apply"):
        cut.cut(tree, patches, out)
