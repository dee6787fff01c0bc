"""The proof matrix: verdict rules and the matrix file itself."""

import os
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from integration_tests import topologies
from keras_fork import pins
from keras_fork import prove
from keras_fork.errors import ForkError


@pytest.mark.parametrize(
    "expect, stock, fork, stock_passed, want",
    [
        ("proven", "fail", "pass", (), "proven"),
        ("proven", "pass", "pass", ("t",), "vacuous"),
        ("proven", "fail", "pass", ("t",), "vacuous"),  # one proving test
        ("guard", "pass", "pass", ("t",), "guard"),
        ("guard", "fail", "pass", (), "proven"),
        ("proven", "fail", "fail", (), "broken"),
        ("guard", "pass", "error", ("t",), "broken"),
        ("proven", "error", "pass", (), "broken"),
        ("proven", None, "pass", (), "n/a"),
        ("n/a", None, None, (), "n/a"),
    ],
)
def test_verdicts(expect, stock, fork, stock_passed, want):
    assert prove.verdict(expect, stock, fork, stock_passed) == want


def test_matrix_is_valid_and_every_fix_is_proven_somewhere():
    cells = prove.load_matrix()
    bases = pins.load_bases(pins.Layout.default())
    fixes = {c.fix for c in cells}
    assert fixes
    for fix in fixes:
        assert any(c.fix == fix and c.expect == "proven" for c in cells), fix
    for c in cells:
        assert c.base in bases, c
        assert c.expect in ("proven", "guard", "n/a")
        assert c.expect != "n/a" or c.reason


def test_every_fix_lists_every_topology():
    # A cell where a backend has no such concept is "n/a" with its reason,
    # never silently absent.
    listed = {}
    for c in prove.load_matrix():
        listed.setdefault((c.base, c.fix), set()).add((c.backend, c.topology))
    for key, cells in listed.items():
        missing = set(topologies.TOPOLOGIES) - cells
        assert not missing, (key, sorted(missing))


def test_multi_process_topologies_leave_devices_to_the_workers():
    env = topologies.env_for("jax", "procs-2", "cpu")
    assert "XLA_FLAGS" not in env
    assert env["JAX_PLATFORMS"] == "cpu"
    for backend, topology in topologies.MULTI_PROCESS:
        assert topologies.known(backend, topology)


def test_local_part_rebuilds_the_global_batches():
    x = np.arange(48)
    parts = [topologies.local_part(x, r, 2, 16) for r in range(2)]
    for b in range(3):
        local = [p[8 * b : 8 * (b + 1)] for p in parts]
        assert np.concatenate(local).tolist() == list(
            range(16 * b, 16 * b + 16)
        )
    with pytest.raises(ValueError, match="do not split evenly"):
        topologies.local_part(np.arange(40), 0, 2, 16)
    with pytest.raises(ValueError, match="do not split evenly"):
        topologies.local_part(np.arange(48), 0, 3, 16)


def test_every_fix_has_integration_tests():
    source = "".join(
        p.read_text()
        for p in (pins.REPO_ROOT / "integration_tests").glob("test_*.py")
    )
    marked = set(re.findall(r'pytest\.mark\.fix\(\s*"([\w-]+)"', source))
    assert {c.fix for c in prove.load_matrix()} <= marked


@pytest.mark.parametrize(
    "cell, error",
    [
        ('"jax/64" = "proven"', "unknown cell jax/64"),
        ('"jax/1" = "maybe"', "expectation 'maybe'"),
        ('"jax/1" = "n/a"', "n/a needs a reason"),
    ],
)
def test_bad_matrix_entries_are_refused(tmp_path, cell, error):
    path = tmp_path / "matrix.toml"
    path.write_text(
        '[fixes.f]\nbases = ["3.15.1"]\n[fixes.f.cells]\n' + cell + "\n"
    )
    with pytest.raises(ForkError, match=re.escape(error)):
        prove.load_matrix(path)


def test_base_cells_replace_cells_for_their_base(tmp_path):
    path = tmp_path / "matrix.toml"
    path.write_text(
        '[fixes.f]\nbases = ["3.7.0", "3.15.1"]\n'
        '[fixes.f.cells]\n"jax/1" = "proven"\n"jax/8" = "guard"\n'
        '[fixes.f.base_cells."3.15.1"]\n"jax/1" = "guard"\n'
    )
    got = {(c.base, c.topology): c.expect for c in prove.load_matrix(path)}
    assert got == {
        ("3.7.0", "1"): "proven",
        ("3.7.0", "8"): "guard",
        ("3.15.1", "1"): "guard",
        ("3.15.1", "8"): "guard",
    }
    path.write_text(
        '[fixes.f]\nbases = ["3.7.0"]\n[fixes.f.cells]\n"jax/1" = "guard"\n'
        '[fixes.f.base_cells."3.15.1"]\n"jax/1" = "guard"\n'
    )
    with pytest.raises(ForkError, match="not in its bases"):
        prove.load_matrix(path)


def test_filters_select_cells_and_refuse_empty_selection():
    cells = prove.load_matrix()
    args = SimpleNamespace(base=None, fix=None, backend=["jax"], topology=["8"])
    chosen = prove.select(cells, args)
    assert chosen and all(
        (c.backend, c.topology) == ("jax", "8") for c in chosen
    )
    args.backend = ["no-such-backend"]
    with pytest.raises(ForkError, match="no matrix cell"):
        prove.select(cells, args)


def test_multi_device_topologies_set_devices_before_the_backend_starts():
    env = topologies.env_for("jax", "8", "cpu")
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert "XLA_FLAGS" not in topologies.env_for("jax", "8", "gpu")
    assert (
        topologies.env_for("tensorflow", "mirrored-2", "cpu")["PROOF_TOPOLOGY"]
        == "mirrored-2"
    )


def test_table_shows_na_reasons():
    table = prove.render_table(
        [
            dict(base="3.15.1", fix="f", backend="torch", topology="ddp-2",
                 stock=None, fork=None, verdict="n/a", reason="why not"),
        ]
    )  # fmt: skip
    assert "| - | - | n/a (why not) |" in table


def test_readme_has_the_generated_table_markers():
    from keras_fork import bench

    text = (pins.REPO_ROOT / "README.md").read_text()
    for marker in (prove.README_BEGIN, prove.README_END, bench.README_BEGIN,
                   bench.README_END):  # fmt: skip
        assert text.count(marker) == 1, marker


def test_child_env_puts_keras_first_and_drops_cell_settings(
    monkeypatch, tmp_path
):
    """One environment for cells, benchmarks and bisection: a cell's
    PROOF_* settings and XLA_FLAGS do not leak into the child; keras, then
    the overlay, then the repository come first on PYTHONPATH."""
    monkeypatch.setenv("PROOF_FIX", "leaked")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    keras_dir, overlay = tmp_path / "fork", tmp_path / "overlay"
    env = prove.child_env(keras_dir, overlay, {"KERAS_BACKEND": "jax"})
    assert "PROOF_FIX" not in env and "XLA_FLAGS" not in env
    assert env["KERAS_BACKEND"] == "jax"
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(keras_dir),
        str(overlay),
        str(pins.REPO_ROOT),
    ]
    bare = prove.child_env(keras_dir, with_repo=False)
    assert bare["PYTHONPATH"] == str(keras_dir)


def test_read_junit_in_one_pass(tmp_path):
    path = tmp_path / "run.xml"
    path.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" '
        'skipped="1">'
        '<testcase name="test_ok"><properties><property name="role" '
        'value="guard"/></properties></testcase>'
        '<testcase name="test_bad"><failure message="\nAssertionError: x\n"/>'
        "</testcase>"
        '<testcase name="test_skip"><skipped message="n/a"/></testcase>'
        "</testsuite></testsuites>"
    )
    result = prove.read_junit(path)
    assert result.counts == {
        "tests": 3,
        "failures": 1,
        "errors": 0,
        "skipped": 1,
    }
    assert [(c["name"], c["outcome"], c["role"]) for c in result.cases] == [
        ("test_ok", "passed", "guard"),
        ("test_bad", "failure", "proof"),
        ("test_skip", "skipped", "proof"),
    ]
    assert result.first_failure == "test_bad: AssertionError: x"
    missing = prove.read_junit(tmp_path / "none.xml")
    assert (missing.counts, missing.cases, missing.first_failure) == (
        {},
        [],
        "",
    )


def test_child_env_matches_what_bisect_and_bench_built_before(
    monkeypatch, tmp_path
):
    """The callers' former inline environments, less PROOF_* (which the
    bisection used to pass on) and plus the overlay (which the benchmark
    used to leave out)."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.setenv("PROOF_FIX", "leaked")
    target = tmp_path / "site"
    cpu = {"KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "",
           "TF_CPP_MIN_LOG_LEVEL": "2"}  # fmt: skip
    before = dict(os.environ, PYTHONPATH=str(target), **cpu)
    del before["XLA_FLAGS"], before["PROOF_FIX"]
    assert prove.child_env(target, topology_env=cpu, with_repo=False) == before
    topo = topologies.env_for("jax", "8", "cpu")
    before = {k: v for k, v in os.environ.items() if not k.startswith("PROOF_")}
    del before["XLA_FLAGS"]
    before.update(topo)
    before["PYTHONPATH"] = os.pathsep.join([str(target), str(pins.REPO_ROOT)])
    assert prove.child_env(target, None, topo) == before  # base without overlay


def test_unit_cells_share_one_fork_run_per_backend(tmp_path, monkeypatch):
    def cell(fix, backend):
        return prove.Cell("3.15.1", fix, "", backend, "unit", "proven")

    a, b, c = Path("a_test.py"), Path("b_test.py"), Path("c_test.py")
    cells = [cell("f1", "tensorflow"), cell("f2", "tensorflow")]
    cells.append(cell("f3", "jax"))
    units = {
        cells[0].key: prove.UnitTests((a,), ("test_1",)),
        cells[1].key: prove.UnitTests((a, b), ("test_2",)),
        cells[2].key: prove.UnitTests((c,), ("test_3",)),
    }
    shared = prove.shared_unit_tests(cells, units)
    assert shared == {
        ("3.15.1", "tensorflow"): prove.UnitTests((a, b), ("test_1", "test_2")),
        ("3.15.1", "jax"): prove.UnitTests((c,), ("test_3",)),
    }

    # A failure in b_test.py fails only the cells that own b_test.py.
    junit = tmp_path / "shared.xml"
    junit.write_text(
        '<testsuites><testsuite tests="3" failures="1">'
        '<testcase name="test_1" file="a_test.py"/>'
        '<testcase name="test_x" file="a_test.py"><skipped/></testcase>'
        '<testcase name="test_2" file="b_test.py"><failure message="no"/>'
        "</testcase></testsuite></testsuites>"
    )
    monkeypatch.setattr(pins, "REPO_ROOT", tmp_path)
    run = {"outcome": "fail", "detail": "", "counts": {}, "junit": junit.name}
    one = prove.cell_result(run, units[cells[0].key])
    assert (one["outcome"], one["detail"]) == ("pass", "1 passed")
    assert one["counts"]["skipped"] == 1
    two = prove.cell_result(run, units[cells[1].key])
    assert two["outcome"] == "fail" and two["detail"].startswith("test_2")
    # No case of the cell's files ran: an error, never a pass.
    none = prove.cell_result(run, prove.UnitTests((c,), ("test_3",)))
    assert none["outcome"] == "error"
    # A shared run that could not run its tests errors every cell.
    crash = dict(run, outcome="error", detail="timed out after 660s")
    out = prove.cell_result(crash, units[cells[0].key])
    assert (out["outcome"], out["detail"]) == ("error", "timed out after 660s")


def test_multi_process_topologies_refuse_a_scope_in_the_test_process():
    # The test process of a multi-process cell has one device: a model it
    # trained would silently be a 1-device run, so scope() refuses.
    for backend, name in sorted(topologies.MULTI_PROCESS):
        topology = topologies.Topology(backend, name, 2)
        assert topology.multi_process
        with pytest.raises(RuntimeError, match="train in workers"):
            topology.scope()
    assert not topologies.Topology("tensorflow", "mirrored-2", 2).multi_process


def test_a_multi_process_run_holds_every_slot():
    slots = prove.Slots(2)
    with slots.hold(1):
        assert slots.free == 1 and slots.can_take(1)
        assert not slots.can_take(2)
    with slots.hold(2):
        assert slots.free == 0 and not slots.can_take(1)
    assert slots.free == 2
    # While a multi-process run waits, no single-process run may start in
    # the slot that frees: it gets every slot once the running ones end.
    slots.waiting_whole = 1
    assert not slots.can_take(1) and slots.can_take(2)


def test_a_waiting_multi_process_run_starts_before_later_ones():
    slots = prove.Slots(2)
    started = []
    first = slots.hold(1)
    first.__enter__()

    def take(k, name):
        with slots.hold(k):
            started.append(name)

    whole = threading.Thread(target=take, args=(2, "whole"))
    whole.start()
    with slots._cv:  # bounded: the thread registers within 10 s
        assert slots._cv.wait_for(lambda: slots.waiting_whole, timeout=10)
    single = threading.Thread(target=take, args=(1, "single"))
    single.start()
    first.__exit__(None, None, None)
    whole.join(10)
    single.join(10)
    assert started == ["whole", "single"]
