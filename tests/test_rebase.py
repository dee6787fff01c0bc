"""A series moved onto a newer upstream: the ``rebase`` verb and a base
published as ``keras-nightly`` (no test files in its sdist), on fake
upstreams (no network)."""

import hashlib
import zipfile

import pytest

from keras_fork import cli
from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe import rebase
from keras_fork.recipe import sdist
from keras_fork.recipe import series
from keras_fork.recipe import wheel
from tests import fake_upstream as fake

TEST_FILE = "keras/src/shuffle_test.py"
OLD_TEST = "def test_order():\n    assert True\n"
# Master moved the code under the fix: a docstring above it, so the fix's
# hunk only applies with a three-way merge or fuzz.
MOVED = '"""Orders."""\n\n\ndef order(n):\n    return list(range(n))\n'


def _layout(tmp_path, shuffle: str):
    """A layout pinning the fake 9.9.9 (with a test file) and a fake
    nightly whose ``shuffle.py`` is ``shuffle``; both sdists cached."""
    old = fake.make_sdist(tmp_path, {**fake.FILES, TEST_FILE: OLD_TEST})
    stem = f"keras_nightly-{fake.NIGHTLY}"
    new = fake.make_sdist(tmp_path, fake.nightly_files(shuffle), stem)
    layout = fake.make_layout(tmp_path / "repo", _sha(old))
    with layout.pins.open("a") as f:
        f.write(
            f'\n["{fake.NIGHTLY}"]\npackage = "keras-nightly"\n'
            f'sdist_sha256 = "{_sha(new)}"\nfork_build = 1\n'
        )
    layout.cache.mkdir(parents=True)
    for archive in (old, new):
        (layout.cache / archive.name).write_bytes(archive.read_bytes())
    return layout


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _add_fix(layout):
    """The old base's series: one fix with its upstream-style test hunk."""
    base = pins.get_base(layout, fake.VERSION)
    tree = series.materialize(layout, base)
    code = tree / "keras/src/shuffle.py"
    code.write_text(code.read_text().replace("range(n)", "reversed(range(n))"))
    (tree / TEST_FILE).write_text(OLD_TEST + "\n\ndef test_reversed():\n")
    env = series.git_env(fake.EPOCH)
    series.git(
        tree,
        "commit",
        "-qam",
        "Reverse the order\n\nBecause.\n\nFork-Fix: reverse",
        env=env,
    )
    series.export(tree, series.series_dir(layout, base))


def _rebase(layout, *extra):
    argv = [
        "--root",
        str(layout.root),
        "rebase",
        "--base",
        fake.VERSION,
        "--to",
        fake.NIGHTLY,
        *extra,
    ]
    return cli.main(argv)


def test_a_nightly_base_is_named_by_its_project(tmp_path):
    layout = _layout(tmp_path, MOVED)
    base = pins.get_base(layout, fake.NIGHTLY)
    assert base.package == "keras-nightly" and not base.sdist_tests
    assert base.sdist_name == f"keras_nightly-{fake.NIGHTLY}.tar.gz"
    assert base.wheel_name == f"keras-{fake.NIGHTLY}+fork.1-py3-none-any.whl"


def test_an_unknown_package_is_refused(tmp_path):
    layout = _layout(tmp_path, MOVED)
    layout.pins.write_text(
        layout.pins.read_text().replace('"keras-nightly"', '"tf-keras"')
    )
    with pytest.raises(ForkError, match="package must be one of"):
        pins.load_bases(layout)


def test_rebase_moves_the_series_and_keeps_its_test_hunks(tmp_path, capsys):
    layout = _layout(tmp_path, MOVED)
    _add_fix(layout)
    assert _rebase(layout) == 0
    new = pins.get_base(layout, fake.NIGHTLY)
    (patch,) = series.read_series(layout, new)
    text = patch.read_text()
    assert "+    return list(reversed(range(n)))" in text
    assert f"+++ b/{TEST_FILE}" in text and "Fork-Fix: reverse" in text
    # The nightly's tree gets the source hunk; its sdist has no test file.
    tree = series.materialize(layout, new)
    assert "reversed" in (tree / "keras/src/shuffle.py").read_text()
    assert '"""Orders."""' in (tree / "keras/src/shuffle.py").read_text()
    assert not (tree / TEST_FILE).exists()
    whl = wheel.build(layout, new, tree)
    assert whl.name == new.wheel_name
    with zipfile.ZipFile(whl) as z:
        meta = z.read(f"keras-{new.fork_version}.dist-info/METADATA").decode()
    assert "\nName: keras\n" in meta


def test_a_conflict_names_patch_file_and_hunk_and_writes_nothing(
    tmp_path, capsys
):
    layout = _layout(tmp_path, "def order(n):\n    return sorted(range(n))\n")
    _add_fix(layout)
    assert _rebase(layout) == 1
    out = capsys.readouterr().out
    assert "patch 1/1 'Reverse the order'" in out
    assert "conflict in keras/src/shuffle.py: lines 2-6" in out
    dest = series.series_dir(layout, pins.get_base(layout, fake.NIGHTLY))
    assert not list(dest.glob("*.patch"))
    old = series.series_dir(layout, pins.get_base(layout, fake.VERSION))
    assert len(list(old.glob("*.patch"))) == 1
    # A person resolves it; --continue finishes and exports.
    work = rebase.work_dir(layout, pins.get_base(layout, fake.NIGHTLY))
    (work / "keras/src/shuffle.py").write_text(
        "def order(n):\n    return sorted(range(n), reverse=True)\n"
    )
    series.git(work, "add", "keras/src/shuffle.py")
    assert _rebase(layout, "--continue") == 0
    (patch,) = dest.glob("*.patch")
    assert "reverse=True" in patch.read_text()


def test_a_patch_already_upstream_stops_instead_of_dropping(tmp_path, capsys):
    fixed = "def order(n):\n    return list(reversed(range(n)))\n"
    layout = _layout(tmp_path, fixed)
    base = pins.get_base(layout, fake.VERSION)
    tree = series.materialize(layout, base)
    code = tree / "keras/src/shuffle.py"
    code.write_text(fixed)
    series.git(
        tree,
        "commit",
        "-qam",
        "Reverse the order\n\nFork-Fix: r",
        env=series.git_env(fake.EPOCH),
    )
    series.export(tree, series.series_dir(layout, base))
    assert _rebase(layout) == 1
    assert "empty on the new base" in capsys.readouterr().out


def test_rebase_refuses_to_overwrite_a_series(tmp_path):
    layout = _layout(tmp_path, MOVED)
    _add_fix(layout)
    dest = layout.patches / fake.NIGHTLY
    dest.mkdir()
    (dest / "x.patch").write_text("")
    with pytest.raises(ForkError, match="already holds a series"):
        rebase.main(
            type(
                "A",
                (),
                {"base": fake.VERSION, "to": fake.NIGHTLY, "resume": False},
            )(),
            layout,
        )


def test_the_nightly_sdist_is_checked_before_unpacking(tmp_path):
    layout = _layout(tmp_path, MOVED)
    new = pins.get_base(layout, fake.NIGHTLY)
    (layout.cache / new.sdist_name).write_bytes(b"not the sdist")
    with pytest.raises(ForkError, match=r"is corrupt .* Delete that file"):
        sdist.fetch(layout, new)


def test_a_nightly_tree_re_exports_its_series_without_test_hunks(
    tmp_path, capsys
):
    """``check`` (run by ``build``) compares the nightly tree's re-export
    with each patch minus the test files the sdist lacks."""
    layout = _layout(tmp_path, MOVED)
    _add_fix(layout)
    assert _rebase(layout) == 0
    new = pins.get_base(layout, fake.NIGHTLY)
    tree = series.materialize(layout, new)
    assert series.check(layout, new, tree) == []
    (patch,) = series.read_series(layout, new)
    patch.write_text(patch.read_text().replace("reversed", "sorted"))
    assert series.check(layout, new, tree) == [patch.name]
    # `export` writes the tree's source hunks and keeps the file's test hunks.
    tests = series.missing_tests(tree, patch)
    assert tests
    argv = ["--root", str(layout.root), "export", "--base", fake.NIGHTLY]
    assert cli.main(argv) == 0
    assert series.missing_tests(tree, patch) == tests
    assert series.check(layout, new, tree) == []


def test_a_file_gone_upstream_is_named_as_such(tmp_path, capsys):
    """Master deleted or moved a file the patch changes (e.g. the OpenVINO
    backend's layer.py): a modify/delete conflict, named as such."""
    layout = _layout(tmp_path, MOVED)
    _add_fix(layout)
    new = pins.get_base(layout, fake.NIGHTLY)
    files = fake.nightly_files(MOVED)
    del files["keras/src/shuffle.py"]
    stem = f"keras_nightly-{fake.NIGHTLY}"
    archive = fake.make_sdist(tmp_path / "repo", files, stem)
    layout.pins.write_text(
        layout.pins.read_text().replace(new.sdist_sha256, _sha(archive))
    )
    (layout.cache / archive.name).write_bytes(archive.read_bytes())
    assert _rebase(layout) == 1
    assert (
        "conflict in keras/src/shuffle.py: deleted or moved on the new base"
        in capsys.readouterr().out
    )
