"""The proof runner: verdict rules, selection, environments, JUnit, the
shared unit runs and the run slots."""

import os
import threading
from pathlib import Path
from types import SimpleNamespace

import filelock
import numpy as np
import pytest
from rich.console import Console

from integration_tests.harness import data
from integration_tests.harness import devices
from integration_tests.harness import junit
from integration_tests.harness import schedule
from integration_tests.harness import selection
from integration_tests.harness import topologies
from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.proof import cells as cells_lib
from keras_fork.proof import groups
from keras_fork.proof import prove
from keras_fork.proof import runner
from keras_fork.proof import variants
from keras_fork.recipe import pins


@pytest.mark.parametrize(
    "expect, stock, fork, stock_passed, want",
    [
        ("proven", "fail", "pass", (), "proven"),
        ("proven", "pass", "pass", ("t",), "vacuous"),
        ("proven", "fail", "pass", ("t",), "vacuous"),  # one proving test
        ("guard", "pass", "pass", ("t",), "guard"),
        # Never promoted to proven: the declaration or the stock run is wrong.
        ("guard", "fail", "pass", (), "guard-failed-on-stock"),
        ("guard", "fail", "pass", ("t",), "guard-failed-on-stock"),
        ("proven", "fail", "fail", (), "broken"),
        ("guard", "pass", "error", ("t",), "broken"),
        ("proven", "error", "pass", (), "broken"),
        ("proven", None, "pass", (), "n/a"),
        ("n/a", None, None, (), "n/a"),
    ],
)
def test_verdicts(expect, stock, fork, stock_passed, want):
    assert cells_lib.verdict(expect, stock, fork, stock_passed) == want


@pytest.mark.parametrize(
    "expect, stock, skipped, fork_passed, want",
    [
        # t2 proves nothing on stock: skipped there, it runs on the fork.
        ("proven", "fail", ("t2",), ("t1", "t2"), "vacuous"),
        ("proven", "error", ("t1",), ("t1",), "vacuous"),  # nothing ran
        ("proven", "fail", ("t2",), ("t1",), "proven"),  # skipped on both
        ("guard", "pass", ("t2",), ("t1", "t2"), "guard"),
        ("proven", "fail", ("t2",), ("t2",), "vacuous"),
    ],
)
def test_a_proof_test_skipped_on_stock_but_run_on_the_fork_is_vacuous(
    expect, stock, skipped, fork_passed, want
):
    got = cells_lib.verdict(
        expect, stock, "pass", stock_skipped=skipped, fork_passed=fork_passed
    )
    assert got == want


def _settled(tmp_path, monkeypatch, expect, outcomes):
    """One cell of fix ``f`` run on stock and fork from planted JUnit
    files, through ``prove``'s own recording and verdict: ``outcomes`` is
    ``{variant: [(test, role, body), ...]}``. Returns the row."""

    def case(name, role, body):
        return (
            f'<testcase name="{name}" time="1"><properties>'
            '<property name="fix" value="f"/>'
            f'<property name="role" value="{role}"/></properties>{body}'
            "</testcase>"
        )

    cell = cells_lib.Cell("3.15.1", "f", "", "jax", "1", expect)
    plan = SimpleNamespace(cells=[cell], units={})
    rows = {cell.key: prove.new_row(cell, "cpu", {}, plan, ["stock", "fork"])}
    console = Console(quiet=True)
    for group in groups.plan_groups([cell], {}, ["stock", "fork"]):
        xml = tmp_path / f"{group.variant}.xml"
        cases = "".join(case(*c) for c in outcomes[group.variant])
        xml.write_text(f"<testsuite>{cases}</testsuite>")
        run = {"outcome": "pass", "detail": "", "junit": xml.name, "seconds": 1}
        prove._record(group, run, rows, tmp_path, console)
    prove.settle(plan, rows, console)
    return rows[cell.key]


def _reported(row) -> tuple[int, str]:
    console = Console(record=True, width=300)
    return prove._report([row], console), console.export_text()


def test_a_guard_that_fails_on_stock_is_a_problem_with_its_failure(
    tmp_path, monkeypatch, capsys
):
    failed = '<failure message="boom | bad"/>'
    stock = [("test_a", "proof", failed), ("test_b", "guard", "")]
    fork = [("test_a", "proof", ""), ("test_b", "guard", "")]
    row = _settled(
        tmp_path, monkeypatch, "guard", {"stock": stock, "fork": fork}
    )
    assert (row["stock"], row["fork"]) == ("fail", "pass")
    assert row["verdict"] == "guard-failed-on-stock"
    assert row["reason"] == "stock: test_a: boom | bad"
    code, said = _reported(row)
    assert code == 1
    assert (
        "guard-failed-on-stock: 3.15.1 f jax/1: declared guard, fails on "
        "stock: test_a: boom | bad"
    ) in said
    assert prove.totals_line([row]) == (
        "0 proven, 0 guard, 0 n/a, 0 vacuous, 1 guard-failed-on-stock, 0 broken"
    )
    assert "| guard-failed-on-stock (stock: test_a: boom \\| bad) |" in (
        prove.render_table([row])
    )
    monkeypatch.setenv("COLUMNS", "300")
    prove._print_table([row])
    assert "guard-failed-on-stock (stock: test_a: boom | bad)" in (
        capsys.readouterr().out
    )


def test_a_proof_test_skipped_on_stock_makes_a_proven_cell_vacuous(
    tmp_path, monkeypatch
):
    failed, skipped = '<failure message="no"/>', "<skipped/>"
    stock = [
        ("test_a", "proof", failed),
        ("test_b", "proof", skipped),
        ("test_g", "guard", skipped),
    ]
    fork = [("test_a", "proof", ""), ("test_b", "proof", "")]
    fork.append(("test_g", "guard", ""))
    row = _settled(
        tmp_path, monkeypatch, "proven", {"stock": stock, "fork": fork}
    )
    assert row["runs"]["stock"]["skipped_tests"] == ["test_b"]
    verdict = (row["stock"], row["fork"], row["verdict"])
    assert verdict == ("fail", "pass", "vacuous")
    code, said = _reported(row)
    assert code == 1
    assert "skipped on stock, passes on the fork: test_b" in said
    # Skipped on both variants (a topology's skip), or a guard test skipped
    # on stock: the cell stays proven.
    fork[1] = ("test_b", "proof", skipped)
    row = _settled(
        tmp_path, monkeypatch, "proven", {"stock": stock, "fork": fork}
    )
    assert row["verdict"] == "proven" and not row["reason"]
    assert _reported(row)[0] == 0


def test_multi_process_topologies_leave_devices_to_the_workers():
    env = topologies.env_for("jax", "procs-2", "cpu")
    assert "XLA_FLAGS" not in env
    assert env["JAX_PLATFORMS"] == "cpu"
    for backend, topology in topologies.MULTI_PROCESS:
        assert topologies.known(backend, topology)


def test_local_part_rebuilds_the_global_batches():
    x = np.arange(48)
    parts = [data.local_part(x, r, 2, 16) for r in range(2)]
    for b in range(3):
        local = [p[8 * b : 8 * (b + 1)] for p in parts]
        assert np.concatenate(local).tolist() == list(
            range(16 * b, 16 * b + 16)
        )
    with pytest.raises(ValueError, match="do not split evenly"):
        data.local_part(np.arange(40), 0, 2, 16)
    with pytest.raises(ValueError, match="do not split evenly"):
        data.local_part(np.arange(48), 0, 3, 16)


def test_filters_select_cells_and_refuse_empty_selection():
    cells = cells_lib.load_matrix(pins.Layout.default().fixes)
    args = SimpleNamespace(base=None, fix=None, backend=["jax"], topology=["8"])
    chosen = cells_lib.select(cells, args)
    assert chosen and all(
        (c.backend, c.topology) == ("jax", "8") for c in chosen
    )
    args.backend = ["no-such-backend"]
    with pytest.raises(ForkError, match="unknown --backend 'no-such-backend'"):
        cells_lib.select(cells, args)
    args.base, args.fix = ["3.7.0"], ["torch-uneven-steps"]
    args.backend = None
    with pytest.raises(ForkError, match="no matrix cell matches"):
        cells_lib.select(cells, args)


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
            dict(
                base="3.15.1",
                fix="f",
                backend="torch",
                topology="ddp-2",
                stock=None,
                fork=None,
                verdict="n/a",
                reason="why not",
            ),
        ]
    )
    assert "| - | - | n/a (why not) |" in table


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
    env = variants.child_env(keras_dir, overlay, {"KERAS_BACKEND": "jax"})
    assert "PROOF_FIX" not in env and "XLA_FLAGS" not in env
    assert env["KERAS_BACKEND"] == "jax"
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(keras_dir),
        str(overlay),
        str(pins.CODE_ROOT),
    ]
    bare = variants.child_env(keras_dir)
    assert bare["PYTHONPATH"].split(os.pathsep) == [
        str(keras_dir),
        str(pins.CODE_ROOT),
    ]


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
    result = junit.read_junit(path)
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
    missing = junit.read_junit(tmp_path / "none.xml")
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
    cpu = {
        "KERAS_BACKEND": "jax",
        "CUDA_VISIBLE_DEVICES": "",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    paths = os.pathsep.join([str(target), str(pins.CODE_ROOT)])
    before = dict(os.environ, PYTHONPATH=paths, **cpu)
    del before["XLA_FLAGS"], before["PROOF_FIX"]
    assert variants.child_env(target, topology_env=cpu) == before
    topo = topologies.env_for("jax", "8", "cpu")
    before = {k: v for k, v in os.environ.items() if not k.startswith("PROOF_")}
    del before["XLA_FLAGS"]
    before.update(topo)
    before["PYTHONPATH"] = os.pathsep.join([str(target), str(pins.CODE_ROOT)])
    # A base without an overlay:
    assert variants.child_env(target, None, topo) == before


class _FakeInstall:
    """Stands in for pip in ``variants._install_into``: counts installs,
    and the first one waits for ``release`` before it writes the folder."""

    def __init__(self):
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, dest, sources, digest, what):
        self.calls += 1
        self.entered.set()
        assert self.release.wait(timeout=30)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / ".source-sha256").write_text(digest)


def _in_thread(fn, *args, **kwargs):
    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # reported by the test's assertions
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_concurrent_variant_installs_take_turns(tmp_path, monkeypatch):
    """Two xdist workers of the release checks installed the same variant
    at once on a clean checkout: the second deleted the folder the first
    one's benchmark child was importing keras from, and CI failed.
    A second install that starts while the first runs waits for it, then
    finds the stamp and installs nothing."""
    fake = _FakeInstall()
    monkeypatch.setattr(variants, "_install_into", fake)
    waiting = threading.Event()

    class SignallingLock(filelock.FileLock):
        def acquire(self, *args, **kwargs):
            waiting.set()
            return super().acquire(*args, **kwargs)

    dest = tmp_path / "3.15.1" / "fork"
    first, first_box = _in_thread(
        variants.pip_install_target, dest, ["k.whl"], "d1", "fork keras"
    )
    assert fake.entered.wait(timeout=30)
    monkeypatch.setattr(filelock, "FileLock", SignallingLock)
    second, second_box = _in_thread(
        variants.pip_install_target, dest, ["k.whl"], "d1", "fork keras"
    )
    assert waiting.wait(timeout=30)  # the second is at the lock
    fake.release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert not first.is_alive() and not second.is_alive()
    assert first_box == {"value": dest} and second_box == {"value": dest}
    assert fake.calls == 1


def test_variant_install_lock_wait_is_bounded(tmp_path, monkeypatch):
    fake = _FakeInstall()
    monkeypatch.setattr(variants, "_install_into", fake)
    dest = tmp_path / "3.15.1" / "stock"
    first, first_box = _in_thread(
        variants.pip_install_target, dest, ["k.tar.gz"], "d1", "stock keras"
    )
    assert fake.entered.wait(timeout=30)
    try:
        with pytest.raises(ForkError, match="another process held .* 0 s"):
            variants.pip_install_target(
                dest, ["k.tar.gz"], "d1", "stock keras", lock_timeout=0.1
            )
    finally:
        fake.release.set()
        first.join(timeout=30)
    assert first_box == {"value": dest} and fake.calls == 1
    # Once installed, the stamp answers without the lock or pip.
    assert variants.pip_install_target(dest, [], "d1", "stock keras") == dest
    assert fake.calls == 1


def test_variant_install_runs_pip_once_into_a_fresh_folder(
    tmp_path, monkeypatch
):
    calls = []

    def fake_pip(argv, **kwargs):
        calls.append(argv)
        target = Path(argv[argv.index("--target") + 1])
        (target / "keras").mkdir()
        return SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(process.subprocess, "run", fake_pip)
    dest = tmp_path / "3.15.1" / "fork"
    (dest / "stale").mkdir(parents=True)  # an older install, replaced
    assert variants.pip_install_target(dest, ["k.whl"], "d2", "fork") == dest
    assert len(calls) == 1 and calls[0][-1] == "k.whl"
    assert sorted(p.name for p in dest.iterdir()) == [".source-sha256", "keras"]
    assert (dest / ".source-sha256").read_text() == "d2"
    # Only dest and its lock file are left beside it: no temporary folder.
    left = sorted(p.name for p in dest.parent.iterdir())
    assert left == [".fork.lock", "fork"]


def test_unit_cells_share_one_run_per_backend_and_variant(
    tmp_path, monkeypatch
):
    def cell(fix, backend):
        return cells_lib.Cell("3.15.1", fix, "", backend, "unit", "proven")

    a, b, c = Path("a_test.py"), Path("b_test.py"), Path("c_test.py")
    cells = [cell("f1", "tensorflow"), cell("f2", "tensorflow")]
    cells.append(cell("f3", "jax"))
    units = {
        cells[0].key: groups.UnitTests((a,), ("test_1",)),
        cells[1].key: groups.UnitTests((a, b), ("test_2",)),
        cells[2].key: groups.UnitTests((c,), ("test_3",)),
    }
    planned = groups.plan_groups(cells, units, ["stock", "fork"])
    assert [(g.variant, g.backend, g.fixes) for g in planned] == [
        ("stock", "tensorflow", ("f1", "f2")),
        ("fork", "tensorflow", ("f1", "f2")),
        ("stock", "jax", ("f3",)),
        ("fork", "jax", ("f3",)),
    ]
    fork = planned[1]
    assert fork.unit == groups.UnitTests((a, b), ("test_1", "test_2"))

    # A failure in b_test.py fails only the cells that own b_test.py.
    xml = tmp_path / "shared.xml"
    xml.write_text(
        '<testsuites><testsuite tests="3" failures="1">'
        '<testcase name="test_1" file="tests/a_test.py"/>'
        '<testcase name="test_x" file="tests/a_test.py"><skipped/></testcase>'
        '<testcase name="test_2" file="tests/b_test.py"><failure message="no"/>'
        "</testcase></testsuite></testsuites>"
    )
    cases = junit.read_junit(xml).cases
    run = {
        "outcome": "fail",
        "detail": "",
        "counts": {},
        "junit": xml.name,
        "seconds": 9.0,
    }
    one = groups.cell_result(fork, cells[0], run, cases)
    assert (one["outcome"], one["detail"]) == ("pass", "1 passed")
    assert one["counts"]["skipped"] == 1
    assert (one["shared"], one["shared_seconds"]) == (xml.name, 9.0)
    two = groups.cell_result(fork, cells[1], run, cases)
    assert two["outcome"] == "fail" and two["detail"].startswith("test_2")
    # On stock a cell owns only its own added tests: test_2 in a_test.py
    # would not be f1's.
    stock = planned[0]
    assert (
        groups.cell_result(stock, cells[0], run, cases)["counts"]["tests"] == 1
    )
    # No case of the cell's files ran: an error, never a pass.
    alone = groups.Group(
        "3.15.1", "fork", "jax", "unit", (cells[2],), (units[cells[2].key],)
    )
    assert groups.cell_result(alone, cells[2], run, cases)["outcome"] == "error"


def test_integration_cells_share_one_run_and_keep_their_own_cases(
    tmp_path, monkeypatch
):
    def cell(fix, topology="1", expect="proven"):
        return cells_lib.Cell("3.15.1", fix, "", "jax", topology, expect)

    cells = [
        cell("f1"),
        cell("f2"),
        cell("f3", expect="n/a"),
        cell("f4", "procs-2"),
    ]
    planned = groups.plan_groups(cells, {}, ["fork"])
    assert [(g.topology, g.fixes, g.multi_process) for g in planned] == [
        ("1", ("f1", "f2"), False),
        ("procs-2", ("f4",), True),
    ]
    xml = tmp_path / "run.xml"

    def case(name, fix, body=""):
        return (
            f'<testcase name="{name}" time="1.5"><properties>'
            f'<property name="fix" value="{fix}"/></properties>{body}'
            "</testcase>"
        )

    xml.write_text(
        "<testsuites><testsuite>"
        + case("test_a", "f1")
        + case("test_b", "f1")
        + case("test_c", "f2", '<failure message="boom"/>')
        + "</testsuite></testsuites>"
    )
    cases = junit.read_junit(xml).cases
    run = {"outcome": "fail", "junit": xml.name, "seconds": 7.0}
    f1 = groups.cell_result(planned[0], cells[0], run, cases)
    assert (f1["outcome"], f1["seconds"]) == ("pass", 3.0)
    assert f1["passed_tests"] == ["test_a", "test_b"]
    f2 = groups.cell_result(planned[0], cells[1], run, cases)
    assert (f2["outcome"], f2["detail"]) == ("fail", "test_c: boom")


def test_a_run_that_dies_names_its_culprit_and_reruns_the_others():
    def cell(fix):
        return cells_lib.Cell("3.15.1", fix, "", "jax", "1", "proven")

    group = groups.plan_groups(
        [cell("f-1"), cell("f-2"), cell("f-3")], {}, ["stock"]
    )[0]
    run = {"outcome": "error", "detail": "killed after 9s without progress"}
    hung = "integration_tests/fixes/f_2/test_f.py::test_x[1]"
    results, retries = groups.after_error(group, run, hung)
    assert list(results) == [cell("f-2").key]
    assert results[cell("f-2").key]["detail"] == (
        f"{hung} did not finish: killed after 9s without progress"
    )
    assert [r.fixes for r in retries] == [("f-1",), ("f-3",)]
    assert retries[0].slug == "3.15.1-f-1-jax-1-stock"
    # A collection error (no test started): every cell runs on its own.
    results, retries = groups.after_error(group, run, None)
    assert results == {} and len(retries) == 3
    # A one-cell group's error is its cell's.
    results, retries = groups.after_error(retries[0], run, None)
    assert list(results) == [cell("f-1").key] and retries == []


def test_multi_process_topologies_refuse_a_scope_in_the_test_process():
    # The test process of a multi-process cell has one device: a model it
    # trained would silently be a 1-device run, so scope() refuses.
    for backend, name in sorted(topologies.MULTI_PROCESS):
        topology = devices.Topology(backend, name, 2)
        assert topology.multi_process
        with pytest.raises(RuntimeError, match="train in workers"):
            topology.scope()
    assert not devices.Topology("tensorflow", "mirrored-2", 2).multi_process


def test_only_the_one_device_topology_skips_its_one_device_comparisons():
    # On `1` scope() is the one-device reference itself: a comparison of
    # the two cannot fail, so such tests skip there (hard rule 2). Every
    # other topology trains on several replicas and compares for real.
    for backend in ("jax", "tensorflow", "torch"):
        one = devices.Topology(backend, "1", 1)
        assert one.one_device
        with pytest.raises(pytest.skip.Exception, match="cannot fail"):
            devices.skip_comparison_on_one_device(one)
    several = [
        devices.Topology("jax", "8", 8),
        devices.Topology("tensorflow", "mirrored-2", 2, strategy=object()),
        # A one-replica strategy is still a strategy (its own code path).
        devices.Topology("tensorflow", "mirrored-2", 1, strategy=object()),
    ] + [devices.Topology(b, n, 2) for b, n in topologies.MULTI_PROCESS]
    for topology in several:
        assert not topology.one_device, topology
        devices.skip_comparison_on_one_device(topology)  # no skip


def _runs(*kinds):
    # Stand-ins for groups.Group: runs_to_start reads multi_process only.
    return [
        SimpleNamespace(name=f"{kind}{i}", multi_process=kind == "m")
        for i, kind in enumerate(kinds)
    ]


def _names(runs):
    return [r.name for r in runs]


def test_a_multi_process_run_holds_every_slot_and_is_not_starved():
    s0, m1, s2, s3 = _runs("s", "m", "s", "s")
    assert _names(schedule.runs_to_start([s0, m1, s2], [], 2)) == ["s0"]
    # While a multi-process run waits for every slot, the runs queued
    # after it wait too: the running ones drain, then it starts alone.
    assert schedule.runs_to_start([m1, s2], [s0], 2) == []
    assert _names(schedule.runs_to_start([m1, s2], [], 2)) == ["m1"]
    assert schedule.runs_to_start([s2], [m1], 2) == []
    # Single-process runs fill every slot.
    assert _names(schedule.runs_to_start([s2, s3], [], 2)) == ["s2", "s3"]


def test_run_all_starts_what_a_finished_run_returns_before_the_queue():
    s0, m1, s2 = _runs("s", "m", "s")
    retry = SimpleNamespace(name="retry", multi_process=False)
    started, lock = [], threading.Lock()

    def start(r):
        with lock:
            started.append(r.name)
        return r.name

    def finished(r, result):
        assert result == r.name
        return [retry] if r is s0 else None

    schedule.run_all([s0, m1, s2], start, 1, finished)
    assert started == ["s0", "retry", "m1", "s2"]


def test_added_tests_select_their_parameterized_cases_not_substrings():
    added = ("test_fit",)
    for name in ("test_fit", "test_fit[jax-2]", "test_fit_sparse", "test_fit0"):
        assert selection.is_added_test(name, added), name
    # -k test_fit would select these too.
    for name in ("test_fitness", "test_predict_then_test_fit", "test_fi"):
        assert not selection.is_added_test(name, added), name


@pytest.mark.parametrize(
    "base, role", [("3.15.1", "proof"), ("3.16.0.dev2026102704", "guard")]
)
def test_a_proof_upstream_fixed_later_is_a_guard_from_then_on(
    monkeypatch, base, role
):
    """``guard_since="V"``: upstream fixed that defect in V, so on bases
    from V on the test guards instead of proving (issue 24: a fix or part
    of one leaves the proof only with evidence)."""
    mark = pytest.mark.fix("f", guard_since="3.16.0.dev0").mark
    item = SimpleNamespace(get_closest_marker=lambda name: mark)
    monkeypatch.setenv("PROOF_BASE", base)
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    assert selection.role_of(item) == role
    monkeypatch.delenv("PROOF_BASE")
    assert selection.role_of(item) == "proof"


@pytest.mark.parametrize(
    "backend, role", [("tensorflow", "guard"), ("torch", "proof")]
)
def test_guard_since_per_backend(monkeypatch, backend, role):
    """``guard_since={"<backend>": "V"}``: upstream fixed the defect in V on
    those backends only (master leaves the global RNGs untouched, except
    torch's)."""
    mark = pytest.mark.fix("f", guard_since={"tensorflow": "3.16.0.dev0"})
    item = SimpleNamespace(get_closest_marker=lambda name: mark.mark)
    monkeypatch.setenv("PROOF_BASE", "3.16.0.dev2026102704")
    monkeypatch.setenv("KERAS_BACKEND", backend)
    assert selection.role_of(item) == role


@pytest.mark.parametrize(
    "base, backend, absent",
    [
        ("3.16.0.dev2026102704", "tensorflow", True),
        ("3.16.0.dev2026102704", "jax", False),
        ("3.15.1", "tensorflow", False),
        (None, "tensorflow", False),
    ],
)
def test_absent_since_skips_on_that_base_and_backend_only(
    monkeypatch, base, backend, absent
):
    """``absent_since={"<backend>": ("V", why)}``: from base V on, on that
    backend, the fork does not carry what the test checks (the master
    series' tf.data resume, issue 38), so the case is skipped at
    collection with the reason, not reported broken; elsewhere, and in a
    plain pytest run without a base, it runs."""
    why = "left to a design issue"
    mark = pytest.mark.fix(
        "f", absent_since={"tensorflow": ("3.16.0.dev0", why)}
    ).mark
    item = SimpleNamespace(get_closest_marker=lambda name: mark)
    if base is None:
        monkeypatch.delenv("PROOF_BASE", raising=False)
    else:
        monkeypatch.setenv("PROOF_BASE", base)
    monkeypatch.setenv("KERAS_BACKEND", backend)
    assert selection.absent_reason(item) == (why if absent else None)


@pytest.mark.parametrize(
    "base, backend, absent",
    [
        ("3.15.1", "jax", True),
        ("3.15.1", "torch", False),
        ("3.16.0.dev2026102704", "jax", False),
        (None, "jax", False),
    ],
)
def test_absent_before_skips_before_that_base_only(
    monkeypatch, base, backend, absent
):
    """``absent_before={"<backend>": ("V", why)}``: on the bases before V,
    on that backend, the test relies on what came with V (master's
    auto-sharding of a ``PyDataset`` over JAX processes), so the case is
    skipped at collection with the reason; from V on, and in a plain
    pytest run without a base, it runs."""
    why = "no auto-sharded PyDataset before master"
    mark = pytest.mark.fix(
        "f", absent_before={"jax": ("3.16.0.dev0", why)}
    ).mark
    item = SimpleNamespace(get_closest_marker=lambda name: mark)
    if base is None:
        monkeypatch.delenv("PROOF_BASE", raising=False)
    else:
        monkeypatch.setenv("PROOF_BASE", base)
    monkeypatch.setenv("KERAS_BACKEND", backend)
    assert selection.absent_reason(item) == (why if absent else None)


@pytest.mark.parametrize("several", [False, True])
def test_unit_runs_skip_multi_device_tests_on_one_device(several):
    """The unit cells run upstream's test files without Keras's repository
    conftest.py: ``multi_device`` tests (keras/src/backend/jax/
    trainer_test.py's JAXTrainerTest) are skipped on one device, as
    upstream skips them, and run on several."""

    class Item(SimpleNamespace):
        def add_marker(self, mark):
            self.marks.append(mark)

    multi = Item(keywords={"multi_device": True}, marks=[])
    plain = Item(keywords={}, marks=[])
    selection.skip_multi_device([multi, plain], several=several)
    assert plain.marks == []
    assert [m.name for m in multi.marks] == ([] if several else ["skip"])


def test_a_failure_detail_with_brackets_prints_as_text():
    """gloo's messages start with ``[/path/pair.cc:553]``, which rich would
    read as a closing tag (issue 39: a prove run ended in MarkupError)."""
    console = Console(record=True, width=200)
    detail = "RuntimeError: [/__w/gloo/tcp/pair.cc:553] Connection closed"
    prove._print_run(console, "run", {"outcome": "fail"}, "(1.0s)", detail)
    assert detail in console.export_text()


def test_trainer_test_runs_whole_on_jax_only_and_added_tests_elsewhere():
    """The fork's unit runs: every test of the touched files, but for
    ``runner.WHOLE_ON`` files on other backends, where only the added
    tests run (as on stock)."""
    from pathlib import Path

    unit = groups.UnitTests(
        (Path("t/trainer_test.py"), Path("t/layer_test.py")), ("test_new",)
    )

    def selection(backend, variant):
        group = groups.Group("3.15.1", variant, backend, "unit", (), (unit,))
        return runner._unit_selection(group)

    assert selection("jax", "fork") == {}
    assert selection("torch", "fork") == {
        "PROOF_UNIT_TESTS": '["test_new"]',
        "PROOF_UNIT_ADDED_ONLY": '["trainer_test.py"]',
    }
    assert selection("tensorflow", "stock") == {
        "PROOF_UNIT_TESTS": '["test_new"]'
    }
