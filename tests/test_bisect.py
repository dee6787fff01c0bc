"""The bisection's choice of backends and test files (no build, no network)."""

import pytest

from keras_fork import bisect


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
