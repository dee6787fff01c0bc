"""The bisection's choice of backends and test files, and its one pool of
builds and runs (no build, no network)."""

import argparse
import io
import types
from pathlib import Path

import pytest
from rich.console import Console

from keras_fork.errors import ForkError
from keras_fork.proof import bisect
from keras_fork.proof import kerastests


@pytest.mark.parametrize(
    "path,want",
    [
        ("keras/src/backend/jax/distribution_lib_test.py", ["jax"]),
        ("keras/src/backend/tensorflow/distribute_test.py", ["tensorflow"]),
        ("keras/src/backend/torch/core_test.py", ["torch"]),
        (
            "keras/src/backend/common/variables_test.py",
            list(kerastests.BACKENDS),
        ),
        ("keras/src/losses/loss_test.py", list(kerastests.BACKENDS)),
    ],
)
def test_backend_folders_run_with_their_backend_only(path, want):
    assert kerastests.backends_for(path, kerastests.BACKENDS) == want


def test_a_backend_folder_outside_the_selection_runs_nowhere():
    path = "keras/src/backend/jax/distribution_lib_test.py"
    assert kerastests.backends_for(path, ("tensorflow",)) == []


def test_touched_test_files_in_patch_order(tmp_path):
    patch = tmp_path / "0001.patch"
    patch.write_text(
        "+++ b/keras/src/losses/loss.py\n"
        "+++ b/keras/src/losses/loss_test.py\n"
        "+++ b/keras/src/backend/tensorflow/distribute_test.py\n"
        "+++ b/keras/src/losses/loss_test.py\n"
    )
    assert kerastests.touched_test_files([patch]) == [
        "keras/src/losses/loss_test.py",
        "keras/src/backend/tensorflow/distribute_test.py",
    ]


def test_prefix_runs_select_the_tests_the_patch_adds(tmp_path):
    patch = tmp_path / "0001.patch"
    patch.write_text(
        "From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] Fix\n\nWhy.\n---\n"
        "diff --git a/keras/src/losses/loss_test.py "
        "b/keras/src/losses/loss_test.py\n"
        "+++ b/keras/src/losses/loss_test.py\n"
        "+    def test_empty_batch(self):\n"
        "+    def test_empty_batch_sum(self):\n"
        "diff --git a/keras/src/layers/layer_test.py "
        "b/keras/src/layers/layer_test.py\n"
        "+++ b/keras/src/layers/layer_test.py\n"
        "-        self.assertEqual(a, b)\n"
        "+        self.assertAllClose(a, b)\n"
    )
    files = ["keras/src/losses/loss_test.py", "keras/src/layers/layer_test.py"]
    # A file whose existing tests the patch only edits runs whole.
    assert kerastests.added_test_selection(patch, files) == (
        "test_empty_batch or test_empty_batch_sum or layer_test"
    )
    # The same tests by exact name, for the conftest of the copied files:
    # test_empty_batch does not select test_empty_batch_sum's cases by
    # itself, and layer_test.py is not in the files it keeps added tests of.
    assert kerastests.added_tests_env(patch, files) == {
        "PROOF_UNIT_TESTS": '["test_empty_batch", "test_empty_batch_sum"]',
        "PROOF_UNIT_ADDED_ONLY": '["loss_test.py"]',
    }


def _fake_bases(monkeypatch, runs_of, outcome):
    """Two fake bases whose prefixes 'build' at once; ``runs_of(version, k)``
    gives a prefix's runs, ``outcome(run)`` a run's ``(passed, last)``."""
    bases = [types.SimpleNamespace(version=v) for v in ("1.0", "2.0")]
    lengths = {"1.0": 3, "2.0": 2}
    monkeypatch.setattr(
        bisect.series, "read_series", lambda _, b: [0] * lengths[b.version]
    )

    def prepare(layout, base, k, backends, folder, whole, source):
        if runs_of(base.version, k) == "broken":
            raise ForkError(f"{base.version} prefix {k} does not apply")
        return [
            bisect.PrefixRun(k, label, (), {}, folder)
            for label in runs_of(base.version, k)
        ]

    monkeypatch.setattr(bisect, "prepare_prefix", prepare)
    monkeypatch.setattr(bisect, "run_prefix_tests", outcome)
    return bases


def _bisect(bases, jobs=2):
    out = io.StringIO()
    args = argparse.Namespace(backend=None, jobs=jobs, whole_files=False)
    bad = bisect.bisect_bases(None, bases, args, Console(file=out))
    return bad, out.getvalue()


def test_every_prefix_of_every_base_runs_in_one_pool(monkeypatch):
    runs = {("1.0", 1): ["jax"], ("1.0", 2): ["jax", "torch"], ("2.0", 1): []}
    bases = _fake_bases(
        monkeypatch,
        lambda v, k: runs[v, k],
        lambda r: (r.label != "torch", f"{r.label} done"),
    )
    bad, out = _bisect(bases)
    assert bad == ["1.0 prefix 2/3 (torch): torch done"]
    assert "keras 1.0: 2 prefixes built or compiled, 3 test runs" in out
    assert "keras 2.0: 1 prefixes built or compiled, 0 test runs" in out


def test_a_prefix_that_does_not_build_stops_the_bisection(monkeypatch):
    bases = _fake_bases(
        monkeypatch,
        lambda v, k: "broken" if (v, k) == ("2.0", 1) else [],
        lambda r: (True, ""),
    )
    with pytest.raises(ForkError, match="2.0 prefix 1 does not apply"):
        _bisect(bases, jobs=1)


def test_a_prefix_with_no_test_is_byte_compiled_instead_of_built(tmp_path):
    """A prefix whose patch adds no test is checked by compiling the files
    it changes (``_compiles``), unless it changes a packaging file, which
    is built; a file that does not compile names the patch."""
    patch = tmp_path / "0001-x.patch"
    patch.write_text(
        "diff --git a/keras/a.py b/keras/a.py\n--- a/keras/a.py\n"
        "+++ b/keras/a.py\n@@ -1 +1 @@\n-x = 1\n+x = (\n"
    )
    tree = tmp_path / "tree"
    (tree / "keras").mkdir(parents=True)
    (tree / "keras" / "a.py").write_text("x = (\n")
    assert not bisect._touches_packaging(patch)
    with pytest.raises(ForkError, match="0001-x.patch: does not compile"):
        bisect._compiles(tree, patch)
    (tree / "keras" / "a.py").write_text("x = 1\n")
    bisect._compiles(tree, patch)
    packaging = tmp_path / "0002-y.patch"
    packaging.write_text("diff --git a/pyproject.toml b/pyproject.toml\n")
    assert bisect._touches_packaging(packaging)


@pytest.mark.parametrize(
    "code, may_select_none, passed",
    [(5, True, True), (5, False, False), (1, True, False), (0, False, True)],
)
def test_a_multi_device_pass_may_select_no_added_test(
    monkeypatch, code, may_select_none, passed
):
    """The jax 8-device pass of a patch that adds tests, none of them
    ``multi_device``, to a file with such tests (3.15.1's
    keras/src/backend/jax/trainer_test.py) selects none: pytest's exit
    code 5 passes there, nowhere else."""
    monkeypatch.setattr(
        kerastests, "run_pytest", lambda *args: (code, "9 deselected in 0.06s")
    )
    run = bisect.PrefixRun(
        17, "jax, 8 devices", (), {}, Path("."), may_select_none
    )
    assert bisect.run_prefix_tests(run)[0] is passed


def _two_patch_series(tmp_path):
    """The fake upstream with a series of two patches (the second adds a
    test file): ``(layout, base, patches)``."""
    from keras_fork.recipe import series
    from tests import fake_upstream as fake

    layout, base, _ = fake.make_upstream(tmp_path)
    tree = series.materialize(layout, base)
    fake.add_fix(layout, base, tree)
    (tree / "keras/src/shuffle_test.py").write_text("def test_x():\n    pass\n")
    env = series.git_env(fake.EPOCH)
    series.git(tree, "add", "-A", env=env)
    series.git(tree, "commit", "-q", "-m", "Test the order", env=env)
    series.export(tree, series.series_dir(layout, base))
    return layout, base, series.read_series(layout, base)


def test_prefix_k_of_the_series_tree_is_prefix_k_materialized_alone(tmp_path):
    """The bisection materializes each series once (``SeriesTree``) and
    builds prefix k from its commit k: the same commit, hence the same
    tree and wheel, as materializing ``patches[:k]`` alone; the prefix's
    worktree holds only the files asked for that the commit has."""
    from keras_fork.proof import variants
    from keras_fork.recipe import series

    layout, base, patches = _two_patch_series(tmp_path)
    source = bisect.SeriesTree(layout, base, patches, tmp_path / "series")
    asked = ["keras/src/shuffle.py", "keras/src/shuffle_test.py"]
    for k in (1, 2):
        view = source.checkout(k, tmp_path / f"view-{k}", asked)
        _, alone = variants.materialize_subset(
            layout, base, patches[:k], tmp_path / f"alone-{k}", False
        )
        assert series.git(view, "rev-parse", "HEAD") == series.git(
            alone, "rev-parse", "HEAD"
        )
        files = sorted(
            str(p.relative_to(view))
            for p in view.rglob("*")
            if p.is_file() and p.name != ".git"
        )
        assert files == asked[:k]
        for f in files:
            assert (view / f).read_bytes() == (alone / f).read_bytes()
