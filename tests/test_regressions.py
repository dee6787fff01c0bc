"""The regressions verb's comparison and test layout (no keras run)."""

import pytest

from keras_fork.errors import ForkError
from keras_fork.upstream import regressions as r

STOCK = {
    "a_test.py::A::test_ok": ("passed", ""),
    "a_test.py::A::test_broken_by_fork": ("passed", ""),
    "a_test.py::A::test_fixed_by_fork": ("failure", "AssertionError"),
    "a_test.py::A::test_orbax": ("error", "No module named 'orbax.checkpoint'"),
    "a_test.py::A::test_upstream_bug": ("failure", "ValueError: nope"),
    "a_test.py::A::test_skipped": ("skipped", ""),
    "b_test.py::::b_test": ("passed", ""),
}
FORK = dict(
    STOCK,
    **{
        "a_test.py::A::test_broken_by_fork": ("failure", "AssertionError: 1"),
        "a_test.py::A::test_fixed_by_fork": ("passed", ""),
        "a_test.py::A::test_skipped": ("failure", "only run on fork"),
    },
)


def test_each_test_lands_in_its_category():
    fork = dict(FORK)
    del fork["b_test.py::::b_test"]  # a collection error on one side
    fork["c_test.py::::c_test"] = ("error", "collection failure")
    got = r.compare(STOCK, fork)
    assert got.run == 5  # skipped on either side: not compared
    assert got.regressions == [
        ("a_test.py::A::test_broken_by_fork", "AssertionError: 1")
    ]
    assert got.newly_passing == ["a_test.py::A::test_fixed_by_fork"]
    assert got.one_sided == [
        ("b_test.py::::b_test", "stock"),
        ("c_test.py::::c_test", "fork"),
    ]
    assert got.common == [
        ("a_test.py::A::test_orbax", "missing dependency orbax.checkpoint"),
        ("a_test.py::A::test_upstream_bug", "upstream"),
    ]
    assert not got.ok


def test_identical_sides_are_ok():
    assert r.compare(STOCK, dict(STOCK)).ok


def _tree(tmp_path):
    tree = tmp_path / "tree"
    for f in (
        "keras/src/losses/loss.py",
        "keras/src/losses/loss_test.py",
        "keras/src/trainers/trainer_test.py",
        "keras/src/backend/jax/core_test.py",
        "keras/src/backend/torch/core_test.py",
        "keras/src/ops/nn.py",
    ):
        (tree / f).parent.mkdir(parents=True, exist_ok=True)
        (tree / f).write_text("")
    (tree / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nfilterwarnings = ["error", '
        '"ignore::DeprecationWarning"]\n'
    )
    patch = tmp_path / "p.patch"
    patch.write_text(
        "+++ b/keras/src/losses/loss.py\n+++ b/keras/src/ops/nn.py\n"
    )
    return tree, patch


def test_default_tier_is_the_touched_files_tests_and_the_folders(
    tmp_path, monkeypatch
):
    tree, patch = _tree(tmp_path)
    monkeypatch.setattr(r, "DEFAULT_DIRS", ("keras/src/trainers",))
    assert r.default_files(tree, [patch], "jax") == [
        "keras/src/backend/jax/core_test.py",
        "keras/src/losses/loss_test.py",  # beside loss.py; nn.py has none
        "keras/src/trainers/trainer_test.py",
    ]


def test_another_backends_folder_is_left_out_and_unknown_modules_refused(
    tmp_path,
):
    tree, _ = _tree(tmp_path)
    files = sorted(r._for_backend(r._tests_under(tree, "keras"), "torch"))
    assert "keras/src/backend/jax/core_test.py" not in files
    assert "keras/src/backend/torch/core_test.py" in files
    with pytest.raises(ForkError, match="no such test file or folder"):
        r._tests_under(tree, "keras/src/nowhere")


def test_layout_keeps_paths_and_upstreams_warning_filters(tmp_path):
    tree, _ = _tree(tmp_path)
    work = tmp_path / "work"
    r.lay_out_tests(tree, ["keras/src/losses/loss_test.py"], work)
    assert (work / "keras/src/losses/loss_test.py").is_file()
    # Keras's conftest rules come from the plugin the run loads.
    assert not (work / "conftest.py").exists()
    ini = (work / "pytest.ini").read_text()
    assert "filterwarnings =\n    error\n    ignore::DeprecationWarning" in ini


def test_test_files_come_from_an_upstream_clone_at_a_revision(tmp_path):
    """An sdist without test files (3.7.0, keras-nightly) gets upstream's
    test files of a revision of a git clone (``--upstream-repo``)."""
    from keras_fork.recipe import series

    repo = tmp_path / "keras"
    (repo / "keras/src/losses").mkdir(parents=True)
    (repo / "keras/src/losses/loss.py").write_text("x = 1\n")
    test = repo / "keras/src/losses/loss_test.py"
    test.write_text("def test_old():\n    pass\n")
    env = series.git_env(0)
    series.git(repo, "init", "-q", env=env)
    series.git(repo, "add", "-A", env=env)
    series.git(repo, "commit", "-qm", "v1", env=env)
    series.git(repo, "tag", "v1.0.0", env=env)
    test.write_text("def test_new():\n    pass\n")
    series.git(repo, "commit", "-qam", "later", env=env)
    tree = tmp_path / "tree"
    (tree / "keras/src/losses").mkdir(parents=True)
    assert r.add_upstream_tests(tree, repo, "v1.0.0") == 1
    copied = tree / "keras/src/losses/loss_test.py"
    assert "test_old" in copied.read_text()
    assert not (tree / "keras/src/losses/loss.py").exists()  # tests only
    with pytest.raises(ForkError):
        r.add_upstream_tests(tree, repo, "v9.9.9")


def test_a_test_module_imported_from_the_installed_keras_is_named():
    text = "ImportError: cannot import name 'saving_lib_test' from 'keras'"
    assert r.classify_failure(text) == "test module not installed"
    assert r.classify_failure("No module named 'tree'") == (
        "missing dependency tree"
    )


def test_a_declared_change_is_set_apart_from_the_regressions():
    """A fix's ``changed_upstream_tests`` (a deliberate behaviour change,
    e.g. 3.7.0's backported default aggregation) is reported as intended,
    not as a regression; any other regression stays one."""
    result = r.Comparison(
        3, [("a::A::test_x", "boom"), ("a::A::test_y", "bang")], [], [], []
    )
    out = r.set_apart(result, {"a::A::test_x": "aggregation-none: why"})
    assert out.regressions == [("a::A::test_y", "bang")]
    assert out.intended == [("a::A::test_x", "aggregation-none: why")]
    assert not out.ok


def test_the_real_declared_changes_load():
    from keras_fork.recipe import pins

    changed = r.changed_tests(pins.Layout.default(), "3.7.0")
    assert any(t.endswith("::test_variable_aggregation") for t in changed)
    on_3151 = r.changed_tests(pins.Layout.default(), "3.15.1")
    assert all(why.startswith("atomic-save: ") for why in on_3151.values())
    assert any(
        t.endswith("::test_save_model_exception_raised_low_memory_config")
        for t in on_3151
    )
