"""A cell's prerequisites (issue 40): declared in fix.toml, grouped apart
on stock, and built as stock plus exactly those fixes' patches (on a fake
upstream: no network)."""

import dataclasses
import subprocess
import sys

import pytest

from keras_fork.errors import ForkError
from keras_fork.proof import cells as cells_lib
from keras_fork.proof import groups
from keras_fork.proof import prove
from keras_fork.proof import variants
from keras_fork.recipe import series
from tests import fake_upstream as fake

MW = "tensorflow/multiworker-2"


def _write_fix(folder, fid, extra=""):
    """A fix folder whose one cell is ``MW``, on bases 1.0 and 2.0."""
    path = folder / fid.replace("-", "_")
    path.mkdir(parents=True)
    (path / "fix.toml").write_text(
        f'id = "{fid}"\nissue = "x#1"\nbases = ["1.0", "2.0"]\n'
        f'summary = "s"\n\n[cells]\n"{MW}" = "proven"\n{extra}'
    )


def test_a_cell_s_stock_side_carries_its_declared_prerequisites(tmp_path):
    _write_fix(tmp_path, "enabler")
    _write_fix(
        tmp_path,
        "needy",
        f'\n[prerequisites]\n"{MW}" = ["enabler"]\n\n'
        f'[base_prerequisites."2.0"]\n"{MW}" = []\n',
    )
    cells = {(c.fix, c.base): c for c in cells_lib.load_matrix(tmp_path)}
    assert cells["needy", "1.0"].needs == ("enabler",)
    assert cells["needy", "1.0"].stock_side == "stock+enabler"
    assert cells["needy", "2.0"].stock_side == "stock"  # [] on 2.0
    assert cells["enabler", "1.0"].stock_side == "stock"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (f'"{MW}" = ["nosuch"]', "unknown prerequisite fix nosuch"),
        (f'"{MW}" = ["needy"]', "cannot be its own prerequisite"),
        (f'"{MW}" = "enabler"', "is not a list of fix ids"),
        ('"jax/1" = ["enabler"]', "prerequisites of no cell"),
    ],
)
def test_bad_prerequisites_are_refused_by_name(tmp_path, table, message):
    _write_fix(tmp_path, "enabler")
    _write_fix(tmp_path, "needy", f"\n[prerequisites]\n{table}\n")
    with pytest.raises(ForkError, match=message):
        cells_lib.load_matrix(tmp_path)


def test_stock_runs_apart_by_prerequisites_and_the_fork_runs_once():
    plain = cells_lib.Cell(
        "1.0", "a", "x#1", "tensorflow", "multiworker-2", "proven"
    )
    needy = cells_lib.Cell(
        "1.0", "b", "x#1", "tensorflow", "multiworker-2", "proven", "", ("a",)
    )
    planned = groups.plan_groups([plain, needy], {}, ["stock", "fork"])
    sides = sorted((g.side, g.fixes) for g in planned)
    assert sides == [
        ("fork", ("a", "b")),
        ("stock", ("a",)),
        ("stock+a", ("b",)),
    ]
    (alone,) = [g for g in planned if g.needs]
    assert alone.slug == "1.0-b-tensorflow-multiworker-2-stock+a"
    assert alone.alone(needy).side == "stock+a"


@pytest.fixture
def two_fixes(tmp_path):
    """A fake upstream with a series of two fixes: ``reverse`` (shuffle.py,
    and a new test file) and ``helper`` (a new module, and a test in the
    test file ``reverse`` adds: its test hunk cannot apply without it).
    Returns ``(layout, base, [reverse patch, helper patch])``."""
    layout, base, _ = fake.make_upstream(tmp_path)
    tree = series.materialize(layout, base)
    env = series.git_env(fake.EPOCH)
    edits = [
        ("reverse", "keras/src/shuffle.py", "reversed(range(n))"),
        ("helper", "keras/src/helper.py", None),
    ]
    for fid, path, text in edits:
        f = tree / path
        if text:
            f.write_text(f.read_text().replace("range(n)", text))
        else:
            f.write_text("HELP = 1\n")
        test = tree / "keras/src/shuffle_test.py"
        old = test.read_text() if test.exists() else ""
        test.write_text(old + f"def test_{fid}():\n    pass\n")
        series.git(tree, "add", "-A", env=env)
        message = f"Add {fid}\n\nWhy.\n\nFork-Fix: {fid}\nForwarded: no"
        series.git(tree, "commit", "-q", "-m", message, env=env)
    names = series.export(tree, series.series_dir(layout, base))
    return layout, base, [series.series_dir(layout, base) / n for n in names]


def test_stock_plus_a_prerequisite_has_its_source_and_nothing_else(two_fixes):
    layout, base, (reverse, helper) = two_fixes
    patches = variants.prerequisite_patches(
        layout, base, ("helper",), "reverse"
    )
    assert patches == [helper]
    dest = variants.install_prerequisites(layout, base, ("helper",), patches)
    assert dest == layout.variant(base.version, "stock+helper")
    code = (
        "import keras.src.helper as h, keras.src.shuffle as s;"
        "print(h.HELP, s.order(3))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(dest)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["1", "[0,", "1,", "2]"]  # not reversed
    stamp = (dest / variants.STAMP).read_text()
    again = variants.install_prerequisites(layout, base, ("helper",), patches)
    assert again == dest and (dest / variants.STAMP).read_text() == stamp
    # A new fork build number: the wheel reports another version, so the
    # variant is installed again (the harness checks the version).
    bumped = dataclasses.replace(base, fork_build=base.fork_build + 1)
    variants.install_prerequisites(layout, bumped, ("helper",), patches)
    assert (dest / variants.STAMP).read_text() != stamp
    assert list(dest.glob(f"keras-{bumped.fork_version}.dist-info"))


def test_prerequisites_that_cannot_stand_apart_are_named(two_fixes):
    layout, base, _ = two_fixes
    with pytest.raises(variants.PrerequisiteError, match="nosuch has no"):
        variants.prerequisite_patches(layout, base, ("nosuch",), "reverse")
    (patch,) = variants.prerequisite_patches(
        layout, base, ("reverse",), "helper"
    )
    text = patch.read_text().replace("Fork-Fix: reverse", "Fork-Fix: reverse,x")
    patch.write_text(text)
    with pytest.raises(variants.PrerequisiteError, match="also carries x"):
        variants.prerequisite_patches(layout, base, ("reverse",), "x")


# A hunk on what ``reverse`` wrote: a patch holding it needs ``reverse``.
AFTER_REVERSE = (
    "diff --git a/keras/src/shuffle.py b/keras/src/shuffle.py\n"
    "--- a/keras/src/shuffle.py\n+++ b/keras/src/shuffle.py\n"
    "@@ -1,2 +1,2 @@\n def order(n):\n"
    "-    return list(reversed(range(n)))\n"
    "+    return list(range(n))[::-1]\n"
)


def test_a_prerequisite_that_needs_an_earlier_patch_makes_the_cell_na(
    two_fixes,
):
    layout, base, (_, helper) = two_fixes
    block = "diff --git a/keras/src/helper.py"
    helper.write_text(helper.read_text().replace(block, AFTER_REVERSE + block))
    cell = cells_lib.Cell(
        base.version,
        "z",
        "x#1",
        "tensorflow",
        "multiworker-2",
        "proven",
        needs=("helper",),
    )
    installed = {base.version: {}}
    (out,) = prove.with_prerequisites(
        layout, [cell], {base.version: base}, installed
    )
    assert out.expect == "n/a"
    assert out.reason.startswith("stock+helper cannot be built: without the")
    assert "keras/src/shuffle.py" in out.reason
    assert installed == {base.version: {}}
