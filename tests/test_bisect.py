"""The bisection's choice of backends and test files (no build, no network)."""

import pytest

from keras_fork.proof import bisect


@pytest.mark.parametrize(
    "path,want",
    [
        ("keras/src/backend/jax/distribution_lib_test.py", ["jax"]),
        ("keras/src/backend/tensorflow/distribute_test.py", ["tensorflow"]),
        ("keras/src/backend/torch/core_test.py", ["torch"]),
        ("keras/src/backend/common/variables_test.py", list(bisect.BACKENDS)),
        ("keras/src/losses/loss_test.py", list(bisect.BACKENDS)),
    ],
)
def test_backend_folders_run_with_their_backend_only(path, want):
    assert bisect.backends_for(path, bisect.BACKENDS) == want


def test_a_backend_folder_outside_the_selection_runs_nowhere():
    path = "keras/src/backend/jax/distribution_lib_test.py"
    assert bisect.backends_for(path, ("tensorflow",)) == []


def test_touched_test_files_in_patch_order(tmp_path):
    patch = tmp_path / "0001.patch"
    patch.write_text(
        "+++ b/keras/src/losses/loss.py\n"
        "+++ b/keras/src/losses/loss_test.py\n"
        "+++ b/keras/src/backend/tensorflow/distribute_test.py\n"
        "+++ b/keras/src/losses/loss_test.py\n"
    )
    assert bisect.touched_test_files([patch]) == [
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
    assert bisect.added_test_selection(patch, files) == (
        "test_empty_batch or test_empty_batch_sum or layer_test"
    )
