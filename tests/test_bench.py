"""The benchmark: its lockstep of live workers, its results documents, and
its work counts on the fork."""

import json
import os
import pathlib
import select
import statistics
import sys
import time
import types

import pytest
from packaging.version import Version

from keras_fork import cli
from keras_fork.bench import bench
from keras_fork.bench import counters
from keras_fork.bench import counts
from keras_fork.bench import lockstep
from keras_fork.bench import suite
from keras_fork.bench import tables
from keras_fork.errors import ForkError
from keras_fork.proof import variants
from keras_fork.recipe import pins


def _row(case, backend, topology, ratio, date="2026-11-22"):
    return {
        "case": case,
        "backend": backend,
        "topology": topology,
        "stock_median_s": 1.0,
        "fork_median_s": ratio,
        "ratio": ratio,
        "ratio_ci_low": ratio,
        "ratio_ci_high": ratio,
        "ratio_min": ratio,
        "ratio_max": ratio,
        "pairs": 30,
        "stock_peak_mib": 1.0,
        "fork_peak_mib": 1.0,
        "date": date,
    }


def _doc(rows, machine="x86_64, 2 cores, CPU", rounds=8):
    return {
        "base": "3.15.1",
        "date": rows[0]["date"],
        "machine": machine,
        "rounds": rounds,
        "method": lockstep.METHOD,
        "cases": rows,
    }


SHUFFLE = "shuffle epoch, 10M samples"
MLP = "fit step, small MLP"


def test_a_run_of_some_cases_replaces_only_their_rows():
    previous = _doc(
        [
            _row(SHUFFLE, "jax", "1", 1.0),
            _row(SHUFFLE, "tensorflow", "1", 1.3),
            _row(MLP, "jax", "1", 1.1),
        ]
    )
    doc = _doc([_row(SHUFFLE, "tensorflow", "1", 0.8, "2026-11-23")])
    merged = tables.merge(previous, doc)
    assert [(r["backend"], r["ratio"]) for r in merged["cases"]] == [
        ("jax", 1.0),
        ("tensorflow", 0.8),
        ("jax", 1.1),
    ]
    table = tables.render_table(merged)
    assert "2026-11-22..2026-11-23" in table
    assert "| shuffle epoch, 10M samples | tensorflow | 1 |" in table


def test_cases_are_selected_by_name_backend_and_topology():
    def keys(cases):
        return [(c[0], c[2], c[3]) for c in cases]

    assert suite.select_cases() == suite.CASES
    cnn = "fit step, CNN + BatchNorm"
    assert keys(suite.select_cases(["CNN"], None, ["1"])) == [
        (cnn, "jax", "1"),
        (cnn, "torch", "1"),
        (cnn, "tensorflow", "1"),
    ]
    assert keys(suite.select_cases([cnn], ["torch", "tensorflow"], ["1"])) == [
        (cnn, "torch", "1"),
        (cnn, "tensorflow", "1"),
    ]
    assert keys(suite.select_cases(None, ["torch"], ["ddp-2"])) == [
        ("DDP loop step, small MLP", "torch", "ddp-2"),
        ("DDP loop step, CNN + BatchNorm", "torch", "ddp-2"),
    ]
    assert suite.select_cases(["no such case"]) == []


def test_rows_of_another_machine_rounds_or_kind_are_dropped():
    previous = _doc([_row(MLP, "jax", "1", 1.1)])
    doc = _doc([_row(SHUFFLE, "jax", "1", 1.0)], rounds=3)
    assert tables.merge(previous, doc) is doc
    doc = _doc([_row(SHUFFLE, "jax", "1", 1.0)], machine="aarch64")
    assert tables.merge(previous, doc) is doc
    assert tables.merge(None, doc) is doc
    doc = dict(_doc([_row(SHUFFLE, "jax", "1", 1.0)]), aa=True)
    assert tables.merge(previous, doc) is doc
    # Rows timed a process per measurement (before the lockstep).
    doc = _doc([_row(SHUFFLE, "jax", "1", 1.0)])
    assert tables.merge(dict(previous, method=None), doc) is doc


def test_an_aa_table_says_it_measures_stock_twice():
    doc = dict(_doc([_row(MLP, "jax", "1", 1.1)]), aa=True)
    table = tables.render_table(doc)
    assert "A/A run: the fork column is stock again" in table
    assert "paired stock/stock ratios" in table
    assert "fork/stock" not in table
    assert "paired fork/stock ratios" in tables.render_table(
        dict(doc, aa=False)
    )


STOCK_FILE = 'source_file="/a/stock/keras/src/trainers/trainer.py"'
HLO = (
    "HloModule jit_train_step\n\n"
    "ENTRY %main.4 (p.1: f32[2]) -> f32[] {\n"
    "  %p.1 = f32[2]{0} parameter(0), "
    f'metadata={{op_name="x" {STOCK_FILE} source_line=462}}\n'
    "  %c.2 = f32[] constant(0)\n"
    "  ROOT %r.3 = f32[] reduce(%p.1, %c.2), dimensions={0}, "
    f'to_apply=%add, metadata={{op_name="sum" {STOCK_FILE} '
    "source_line=9}, stack_frame_id=3\n"
    "}\n"
)


def test_canonical_hlo_ignores_source_locations_not_ops():

    stock = counters.canonical_hlo(HLO)
    assert len(stock) == 3
    # The same program from another install, emitted by other lines.
    moved = HLO.replace("/a/stock/", "/a/fork/").replace("=462", "=476")
    assert counters.canonical_hlo(moved) == stock
    # One more op is a different program.
    extra = HLO.replace(
        "  %c.2 = f32[] constant(0)\n",
        "  %c.2 = f32[] constant(0)\n  %n.5 = f32[2]{0} negate(%p.1)\n",
    )
    assert len(counters.canonical_hlo(extra)) == 4


def test_hlo_collectives_counts_cross_device_ops_once_each():

    lines = counters.canonical_hlo(
        HLO.replace(
            "  %c.2 = f32[] constant(0)\n",
            "  %c.2 = f32[] constant(0)\n"
            "  %ar.5 = f32[2]{0} all-reduce(%p.1), replica_groups={}, "
            "to_apply=%add\n"
            "  %ags.6 = (f32[2]{0}, f32[4]{0}) all-gather-start(%p.1), "
            "dimensions={0}\n"
            "  %agd.7 = f32[4]{0} all-gather-done(%ags.6)\n",
        )
    )
    # The async pair counts once; the plain reduce is not a collective.
    assert counters.hlo_collectives(lines) == 2
    assert counters.hlo_collectives(counters.canonical_hlo(HLO)) == 0


def _work_row(case, stock_graph, fork_graph, stock_calls=400.0, fork=402.0):
    return {
        "case": case,
        "backend": "jax",
        "topology": "1",
        "stock_calls": stock_calls,
        "fork_calls": fork,
        "stock_calls_max": stock_calls,
        "fork_calls_max": fork,
        "stock_graph": stock_graph,
        "fork_graph": fork_graph,
    }


def test_the_work_table_says_whether_the_compiled_steps_match():
    hlo = {"kind": "XLA HLO", "ops": 245, "digest": "55f943beacb0"}
    grown = {"kind": "XLA HLO", "ops": 251, "digest": "0123456789ab"}
    doc = dict(
        _doc([{"date": "2026-11-23"}]),
        cases=[
            _work_row(MLP, hlo, hlo),
            _work_row(MLP + " 2", hlo, grown),
            _work_row("stateless_call", None, None, 100.0, 99.5),
        ],
    )
    table = tables.render_work_table(doc)
    assert "| 400.0 | 402.0 | +2.0 | same XLA HLO (245 ops) |" in table
    assert "| differs: XLA HLO 245/251 ops |" in table
    assert "| 100.0 | 99.5 | -0.5 | - (eager) |" in table
    counted = dict(hlo, collectives=2, eager_per_step=0.0)
    more = dict(grown, collectives=4, eager_per_step=0.5)
    doc["cases"] = [_work_row(MLP, counted, more)]
    assert (
        "differs: XLA HLO 245/251 ops; collectives/step 2 -> 4, eager "
        "reductions/step 0 -> 0.5 |" in tables.render_work_table(doc)
    )


@pytest.mark.release
@pytest.mark.parametrize(
    "backend, kind", [("jax", "XLA HLO"), ("tensorflow", "TF graph")]
)
def test_work_mode_finds_the_compiled_step(backend, kind):
    # On the built fork: the XLA dump names and the TF trainer's closures
    # that compiled_step reads are upstream's, and may move.
    layout = pins.Layout.default()
    bases = pins.load_bases(layout)
    base = bases[max(bases, key=Version)]
    fork = variants.install_variants(layout, base)["fork"]
    result = counts.run_worker(
        fork,
        variants.install_overlay(layout, base),
        "fit_step",
        backend,
        "1",
        {"samples": 256, "batch_size": 64, "epochs": 2, "work": True},
        "cpu",
    )
    assert len(result["calls_per_step"]) == 2
    assert min(result["calls_per_step"]) > 0
    assert result["graph"]["kind"] == kind
    assert result["graph"]["ops"] > 0


@pytest.mark.release
def test_work_mode_counts_the_reductions_of_a_mirrored_step():
    # On the built fork and its stock, 2 replicas (logical CPUs): stock
    # reduces the gradients and the step's outputs (2 per step); the fork
    # also reads the loss tracker's state summed over the replicas for the
    # batch logs (per-batch-logs: its total and count, 2 more). A change
    # here is a change of per-step cost: docs/upstream.md lists them.
    layout = pins.Layout.default()
    bases = pins.load_bases(layout)
    base = bases[max(bases, key=Version)]
    dirs = variants.install_variants(layout, base)
    overlay = variants.install_overlay(layout, base)
    graphs = {
        variant: counts.run_worker(
            dirs[variant],
            overlay,
            "fit_step",
            "tensorflow",
            "mirrored-2",
            {"samples": 256, "batch_size": 64, "epochs": 1, "work": True},
            "cpu",
        )["graph"]
        for variant in ("stock", "fork")
    }
    assert graphs["stock"]["collectives"] == 2
    assert graphs["fork"]["collectives"] == 4


class FakeWorker:
    """Answers turns from a list of durations, as a LiveWorker would."""

    def __init__(self, name, durations, log):
        self.name, self.durations, self.log = name, list(durations), log

    def ready(self):
        self.log.append(f"{self.name} ready")

    def turn(self):
        self.log.append(self.name)
        return self.durations.pop(0)

    def close(self):
        assert not self.durations
        return {"peak_mib": 1.0}


def test_a_round_alternates_strictly_and_drops_the_settling_turns():
    log = []
    workers = {
        "stock": FakeWorker("stock", [9.0, 1.0, 1.0, 2.0, 2.0], log),
        "fork": FakeWorker("fork", [9.0, 1.0, 1.5, 2.0, 2.0], log),
    }
    times, ratios, peaks = lockstep.measure_round(0, workers, 5)
    assert log[:2] == ["stock ready", "fork ready"]
    assert log[2:] == ["stock", "fork"] * 5  # never twice in a row
    assert times["stock"] == [1.0, 1.0, 2.0, 2.0]
    assert times["fork"] == [1.0, 1.5, 2.0, 2.0]
    # Each fork turn against the mean of the stock turns around it (the
    # last fork turn has none after it): the machine slowing down from 1.0
    # to 2.0 during the fork's 1.5 weighs on both sides of its ratio.
    assert ratios == [1.0, 1.0, 1.0]
    assert peaks == {"stock": 1.0, "fork": 1.0}


def test_odd_rounds_start_with_the_fork():
    log = []
    workers = {
        "stock": FakeWorker("stock", [1.0] * 3, log),
        "fork": FakeWorker("fork", [2.0] * 3, log),
    }
    _, ratios, _ = lockstep.measure_round(1, workers, 3)
    assert lockstep.round_order(1) == ("fork", "stock")  # started in this order
    assert log == ["fork ready", "stock ready"] + ["fork", "stock"] * 3
    assert ratios == [2.0]  # fork, stock, [fork], stock
    with pytest.raises(ValueError, match="at least 3 turns"):
        lockstep.measure_round(0, workers, 2)


def test_the_median_interval_holds_the_median():
    ratios = [0.9, 0.95, 1.0, 1.0, 1.02, 1.05, 1.1, 1.3, 0.97, 1.01]
    low, high = lockstep.median_ci([ratios[:5], ratios[5:]])
    assert low <= statistics.median(ratios) <= high
    assert 0.9 <= low and high <= 1.3
    assert lockstep.median_ci([[1.0, 1.0], [1.0]]) == (1.0, 1.0)


def test_the_interval_widens_with_the_spread_between_rounds():
    # The same 40 ratios: tight within each round, but two rounds (two
    # process pairs) sit 10% above the others. Resampling the rounds says
    # the median is uncertain between them; pooling the ratios would not.
    low_rounds = [[1.0 + 0.001 * i for i in range(10)]] * 2
    high_rounds = [[1.1 + 0.001 * i for i in range(10)]] * 2
    low, high = lockstep.median_ci(low_rounds + high_rounds)
    assert low < 1.01 and high > 1.1
    pooled = lockstep.median_ci([sum(low_rounds + high_rounds, [])])
    assert pooled[1] - pooled[0] < high - low


def _gated(script, timeout=60, env=None):
    """A LiveWorker running ``script`` with the real Gate."""
    prelude = (
        "import json, os, sys, time\n"
        "from keras_fork.bench.protocol import Gate\n"
        "gate = Gate.from_env()\n"
    )
    return lockstep.LiveWorker(
        "fake",
        [sys.executable, "-c", prelude + script],
        dict(os.environ, **(env or {})),
        timeout=timeout,
    )


def _alive(pid):
    from tests.test_multiprocess import _alive

    return _alive(pid)


def test_a_live_worker_runs_a_repetition_per_turn():
    worker = _gated(
        "for t in (0.5, 0.25):\n"
        "    gate.wait()\n"
        "    gate.report(t)\n"
        "gate.close()\n"
        "print(json.dumps({'seconds': [], 'peak_mib': 7.0}))\n"
    )
    try:
        worker.ready()
        assert [worker.turn(), worker.turn()] == [0.5, 0.25]
        assert worker.close()["peak_mib"] == 7.0
    finally:
        worker.kill()


@pytest.mark.parametrize(
    "script, message",
    [
        ("gate.wait()\nsys.exit(3)\n", "exited with status 3"),
        ("gate.wait()\nprint('oops', file=sys.stderr)\nsys.exit(1)\n", "oops"),
        (
            "gate.wait()\ngate._send({'seconds': 'soon'})\ngate.close()\n",
            "not a duration",
        ),
    ],
)
def test_a_failing_worker_is_named_with_its_status_and_log(script, message):
    worker = _gated(script)
    try:
        worker.ready()
        with pytest.raises(bench.ForkError, match=message) as e:
            worker.turn()
        assert "benchmark worker fake" in str(e.value)
    finally:
        worker.kill()


def test_a_worker_that_dies_before_its_first_turn_fails_at_once():
    worker = _gated("sys.exit(5)\n", timeout=120)
    start = time.monotonic()
    try:
        with pytest.raises(bench.ForkError, match="exited with status 5"):
            worker.ready()
    finally:
        worker.kill()
    assert time.monotonic() - start < 30  # not the 120 s timeout


def test_a_hanging_worker_times_out_and_its_group_is_killed(tmp_path):
    # The worker starts a child (in its process group), then hangs.
    worker = _gated(
        "import subprocess, threading\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import threading; threading.Event().wait()'])\n"
        "open(os.environ['PID_FILE'], 'w').write(str(child.pid))\n"
        "gate.wait()\n"
        "threading.Event().wait()\n",
        timeout=3,
        env={"PID_FILE": str(tmp_path / "child")},
    )
    try:
        worker.ready()
        with pytest.raises(bench.ForkError, match="did not answer in 3 s"):
            worker.turn()
    finally:
        worker.kill()
    assert not _alive(worker.proc.pid)
    child = int((tmp_path / "child").read_text())
    # SIGKILL reaches the child asynchronously: wait (bounded) for its exit.
    try:
        fd = os.pidfd_open(child)
    except ProcessLookupError:
        return  # gone already
    try:
        select.select([fd], [], [], 30)
    finally:
        os.close(fd)
    assert not _alive(child)


def test_the_gate_is_on_loopback_only():
    from keras_fork.bench.protocol import Gate

    with pytest.raises(ValueError, match="127.0.0.1"):
        Gate("10.0.0.1:5000")
    Gate(None).wait()  # no benchmark: every repetition runs at once


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--aa", "--work"], "no A/A run"),
        (["--alone"], "--alone counts collectives: it needs --work"),
        (["--work", "--pr", "3"], "--pr picks the PRs of --alone"),
        (["--case", "no such case"], "unknown --case 'no such case'; valid:"),
        (["--backend", "mxnet"], "unknown --backend 'mxnet'; valid: jax,"),
        (["--topology", "7"], "unknown --topology '7'; valid: 1, 8,"),
        (
            ["--case", "DDP", "--topology", "1"],
            "no case matches",
        ),
    ],
)
def test_a_refused_option_combination_exits_2(argv, message, tmp_path, capsys):
    assert cli.main(["--root", str(tmp_path), "bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err
    assert not (tmp_path / "dist").exists()  # refused before measuring


def _fake_measurements(monkeypatch):
    """``bench`` without workers: one base, canned run and work documents."""
    base = types.SimpleNamespace(version="3.15.1")
    monkeypatch.setattr(bench.pins, "select_bases", lambda layout, v: [base])
    monkeypatch.setattr(
        lockstep, "run", lambda *a: _doc([_row(MLP, "jax", "1", 1.1)])
    )
    hlo = {"kind": "XLA HLO", "ops": 245, "digest": "55f943beacb0"}
    work = dict(
        _doc([{"date": "2026-11-23"}]), cases=[_work_row(MLP, hlo, hlo)]
    )
    monkeypatch.setattr(counts, "run_work", lambda *a: work)


@pytest.mark.parametrize("option", ["--docs", "--readme"])
def test_the_tables_go_into_docs_benchmarks_md(option, tmp_path, monkeypatch):
    _fake_measurements(monkeypatch)
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    markers = (tables.DOCS_BEGIN, tables.DOCS_END)
    markers += (tables.WORK_BEGIN, tables.WORK_END)
    docs.write_text(
        "# Benchmarks\n{}\nold\n{}\nmid\n{}\nold\n{}\nend\n".format(*markers)
    )
    argv = ["--root", str(tmp_path), "bench", option, "--accelerator", "cpu"]
    assert cli.main(argv) == 0
    assert cli.main([*argv, "--work"]) == 0
    text = docs.read_text()
    timed = text.split(tables.DOCS_BEGIN)[1].split(tables.DOCS_END)[0]
    assert "| fit step, small MLP | jax | 1 | 1000.000 ms |" in timed
    counted = text.split(tables.WORK_BEGIN)[1].split(tables.WORK_END)[0]
    assert "| same XLA HLO (245 ops) |" in counted
    assert "old" not in text
    assert text.startswith("# Benchmarks\n") and "\nmid\n" in text
    assert (tmp_path / "dist" / "bench.json").is_file()
    assert (tmp_path / "dist" / "bench-work.json").is_file()
    assert not (tmp_path / "README.md").exists()


def test_the_aa_table_goes_beside_the_timing_table(tmp_path, monkeypatch):
    _fake_measurements(monkeypatch)
    aa = dict(_doc([_row(MLP, "jax", "1", 1.0)]), aa=True)
    monkeypatch.setattr(lockstep, "run", lambda *a: aa)
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    markers = (tables.DOCS_BEGIN, tables.DOCS_END)
    markers += (tables.AA_BEGIN, tables.AA_END)
    docs.write_text("{}\ntimed\n{}\nmid\n{}\nold\n{}\n".format(*markers))
    argv = ["--root", str(tmp_path), "bench", "--docs", "--aa"]
    assert cli.main([*argv, "--accelerator", "cpu"]) == 0
    text = docs.read_text()
    assert text.split(tables.DOCS_BEGIN)[1].split(tables.DOCS_END)[0] == (
        "\ntimed\n"
    )
    noise = text.split(tables.AA_BEGIN)[1].split(tables.AA_END)[0]
    assert "A/A run" in noise and "old" not in noise
    assert (tmp_path / "dist" / "bench-aa.json").is_file()


def test_without_docs_the_committed_tables_are_left_alone(
    tmp_path, monkeypatch, capsys
):
    _fake_measurements(monkeypatch)
    argv = ["--root", str(tmp_path), "bench", "--accelerator", "cpu"]
    assert cli.main(argv) == 0
    assert "| fit step, small MLP | jax | 1 |" in capsys.readouterr().out
    assert (tmp_path / "dist" / "bench.json").is_file()
    assert not (tmp_path / "docs").exists()


class _CannedLiveWorker:
    """Stands in for ``LiveWorker`` in ``run``: the fork takes 1.5 s a turn
    (1 s for stock), and every worker started is logged."""

    started = []

    def __init__(self, name, cmd, env, cpu=None):
        self.name, self.killed = name, False
        self.keras = env["PYTHONPATH"].split(os.pathsep)[0]
        self.started.append((self, cpu))

    def ready(self):
        pass

    def turn(self):
        return 1.5 if self.name.startswith("fork") else 1.0

    def close(self):
        return {"peak_mib": 2.0}

    def kill(self):
        self.killed = True


@pytest.mark.parametrize("aa", [False, True])
def test_a_run_measures_every_round_of_each_case(aa, monkeypatch):
    started = []
    monkeypatch.setattr(_CannedLiveWorker, "started", started)
    monkeypatch.setattr(lockstep, "LiveWorker", _CannedLiveWorker)
    monkeypatch.setattr(
        variants,
        "install_variants",
        lambda layout, base: {"stock": "/stock", "fork": "/fork"},
    )
    monkeypatch.setattr(variants, "install_overlay", lambda *a: None)
    printed = []
    console = types.SimpleNamespace(print=printed.append)
    base = types.SimpleNamespace(version="3.15.1")
    cases = suite.select_cases([MLP], ["jax"], ["1"])
    doc = lockstep.run(None, base, 3, "cpu", cases, console, aa)
    assert doc["rounds"] == 3 and doc["aa"] is aa
    (row,) = doc["cases"]
    assert (row["case"], row["backend"], row["topology"]) == (MLP, "jax", "1")
    assert row["stock_median_s"] == 1.0 and row["ratio"] == 1.5
    assert len(row["round_ratios"]) == 3
    # 100 epochs + 1 settling turn each; no ratio for the round's first or
    # last turn.
    assert row["pairs"] == 3 * 99
    assert row["pinned_cpu"] == max(os.sched_getaffinity(0))
    names = [w.name for w, _ in started]
    assert names == [
        f"{v} (fit_step, jax/1)"
        for r in range(3)
        for v in lockstep.round_order(r)
    ]
    assert all(w.killed for w, _ in started)
    fork_keras = {w.keras for w, _ in started if w.name.startswith("fork")}
    assert fork_keras == ({"/stock"} if aa else {"/fork"})
    label = "stock/stock (A/A)" if aa else "fork/stock"
    assert printed == [
        f"{MLP} (jax/1): {label} 1.500 [1.500, 1.500], rounds 1.500..1.500"
    ]


def test_the_alone_table_has_a_row_a_pr_and_a_column_a_case():
    def row(case, topology, k, before, after, error=None):
        return {
            "case": case,
            "backend": "tensorflow",
            "topology": topology,
            "pr": k,
            "patch": f"p{k}.patch",
            "stock": before,
            "alone": after,
            "error": error,
            "date": "2026-11-27",
        }

    two, four = {"step": 2, "eager": 0}, {"step": 4, "eager": 0.5}
    doc = _doc(
        [
            row(MLP, "mirrored-2", 1, two, two),
            row(MLP, "mirrored-2", 2, two, four),
            row(MLP, "mirrored-2", 3, two, None, "does not apply"),
            row(SHUFFLE, "1", 1, None, None),
        ]
    )
    table = tables.render_alone_table(doc)
    assert f"| PR | {MLP} (mirrored-2) | {SHUFFLE} (1) |" in table
    assert "| 1 | 2 -> 2 (same) | not counted |" in table
    assert "| 2 | 2 -> 4 + 0.5 | - |" in table
    assert "| 3 | does not apply alone | - |" in table


def _alone_row(k, patch, date, case=MLP):
    two = {"step": 2, "eager": 0}
    return {
        "case": case,
        "backend": "tensorflow",
        "topology": "mirrored-2",
        "pr": k,
        "patch": patch,
        "stock": two,
        "alone": two,
        "error": None,
        "date": date,
    }


def test_counting_some_prs_keeps_the_others_rows_while_they_name_the_patch():
    old = _doc(
        [
            _alone_row(1, "old-first.patch", "2026-11-25"),
            _alone_row(2, "second.patch", "2026-11-25"),
            _alone_row(3, "third.patch", "2026-11-25"),
        ]
    )
    new = _doc([_alone_row(3, "third.patch", "2026-11-27")])
    submission = ["new-first.patch", "second.patch", "third.patch"]
    merged = tables.merge_alone(old, new, submission)
    # PR 1 now names another patch: its old count is dropped, not shown
    # under the new PR; PR 2 keeps its row; PR 3 has the new one.
    assert [(r["pr"], r["date"]) for r in merged["cases"]] == [
        (2, "2026-11-25"),
        (3, "2026-11-27"),
    ]
    table = tables.render_alone_table(merged)
    assert "2026-11-25..2026-11-27" in table
    assert "| 1 |" not in table
    # Counts from another machine are not mixed in.
    other = dict(old, machine="elsewhere")
    assert tables.merge_alone(other, new, submission) == new


def test_an_unknown_pr_number_is_refused_before_anything_is_installed(
    monkeypatch,
):
    layout = types.SimpleNamespace()
    base = types.SimpleNamespace(version="3.16.0.dev1")
    names = [pathlib.Path("a.patch"), pathlib.Path("b.patch")]
    monkeypatch.setattr(
        bench.submission, "read_submission", lambda layout, base: names
    )

    def no_install(*a, **k):
        raise AssertionError("installed a variant")

    monkeypatch.setattr(variants, "install_prerequisites", no_install)
    with pytest.raises(ForkError, match=r"unknown --pr 3; valid: 1\.\.2"):
        counts._alone_variants(layout, base, None, [3])


def test_a_case_with_since_runs_only_on_bases_that_have_it():
    cases = suite.select_cases(["MLP + accuracy/AUC"], None, None)
    backends = {(c[2], c[3]) for c in suite.cases_on_base(cases, "3.15.1")}
    assert ("torch", "dp-2") not in backends
    assert ("tensorflow", "mirrored-2") in backends
    on_master = suite.cases_on_base(cases, "3.16.0.dev2026102704")
    assert ("torch", "dp-2") in {(c[2], c[3]) for c in on_master}


def test_torch_collectives_are_counted_from_the_process_groups_events(
    tmp_path,
):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from keras_fork.bench.counters import TorchCollectiveCounter

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1
    )
    try:
        counter = TorchCollectiveCounter()
        counter.start()
        for _ in range(3):
            dist.all_reduce(torch.ones(2))
        dist.broadcast(torch.ones(1), src=0)
        torch.ones(2).sum()  # not a collective
        counter.stop()
        assert counter.counts == [{"gloo:all_reduce": 3, "gloo:broadcast": 1}]
        off = TorchCollectiveCounter(enabled=False)
        off.start()
        dist.all_reduce(torch.ones(2))
        off.stop()
        assert off.counts == []
    finally:
        dist.destroy_process_group()


def test_an_eager_step_shows_its_collectives_only():
    def graph(n):
        return {"kind": "eager", "collectives": n, "eager_per_step": 0}

    row = {"stock_graph": graph(9.125), "fork_graph": graph(9.125)}
    assert tables._graph_text(row) == (
        "- (eager); collectives/step 9.125 -> 9.125"
    )
    assert tables._graph_text({"stock_graph": None, "fork_graph": None}) == (
        "- (eager)"
    )


def test_a_run_of_one_base_keeps_the_other_bases_runs(tmp_path):
    out = tmp_path / "bench.json"
    master = dict(_doc([_row(MLP, "jax", "1", 1.0)]), base="master")
    old = _doc([_row(MLP, "jax", "1", 1.5)])
    out.write_text(json.dumps({"runs": [old, master]}))
    new = _doc([_row(MLP, "jax", "1", 1.1)])
    runs = bench._with_other_bases(bench._last_runs(out), [new])
    assert [(d["base"], d["cases"][0]["ratio"]) for d in runs] == [
        ("3.15.1", 1.1),
        ("master", 1.0),
    ]


def test_a_case_whose_worker_failed_is_listed_as_not_measured():
    doc = dict(
        _doc([_row(MLP, "jax", "1", 1.0)]),
        failed=[dict(case=MLP, backend="jax", topology="8", error="exited -6")],
    )
    table = tables.render_table(doc)
    assert "| fit step, small MLP | jax | 1 | 1000.000 ms |" in table
    assert "| fit step, small MLP | jax | 8 | - | - | not measured: " in table


def test_a_run_of_one_base_keeps_the_other_bases_tables_of_the_page(tmp_path):
    # A fresh checkout: dist/ has no run of the base this run skips, so
    # its table comes from the page.
    page = tmp_path / "benchmarks.md"
    master = dict(_doc([_row(MLP, "jax", "1", 1.0)]), base="master")
    old = _doc([_row(MLP, "jax", "1", 1.5)])
    markers = (tables.DOCS_BEGIN, tables.DOCS_END)
    page.write_text(
        "head\n"
        + markers[0]
        + "\n"
        + "\n".join(tables.render_table(d) for d in (old, master))
        + markers[1]
        + "\ntail\n"
    )
    on_page = bench._page_tables(page, markers)
    assert list(on_page) == ["3.15.1", "master"]
    new = _doc([_row(MLP, "jax", "1", 1.1)])
    body = bench._in_place(on_page, {"3.15.1": tables.render_table(new)})
    assert body == [tables.render_table(new), tables.render_table(master)]
    assert bench._page_tables(tmp_path / "none.md", markers) == {}
