"""The benchmark's results documents, and its work counts on the fork."""

import pytest
from packaging.version import Version

from keras_fork import bench
from keras_fork import pins
from keras_fork import prove


def _row(case, backend, topology, ratio, date="2026-11-22"):
    return {
        "case": case,
        "backend": backend,
        "topology": topology,
        "stock_median_s": 1.0,
        "fork_median_s": ratio,
        "ratio": ratio,
        "ratio_min": ratio,
        "ratio_max": ratio,
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
    merged = bench.merge(previous, doc)
    assert [(r["backend"], r["ratio"]) for r in merged["cases"]] == [
        ("jax", 1.0),
        ("tensorflow", 0.8),
        ("jax", 1.1),
    ]
    table = bench.render_table(merged)
    assert "2026-11-22..2026-11-23" in table
    assert "| shuffle epoch, 10M samples | tensorflow | 1 |" in table


def test_rows_of_another_machine_rounds_or_kind_are_dropped():
    previous = _doc([_row(MLP, "jax", "1", 1.1)])
    doc = _doc([_row(SHUFFLE, "jax", "1", 1.0)], rounds=3)
    assert bench.merge(previous, doc) is doc
    doc = _doc([_row(SHUFFLE, "jax", "1", 1.0)], machine="aarch64")
    assert bench.merge(previous, doc) is doc
    assert bench.merge(None, doc) is doc
    doc = dict(_doc([_row(SHUFFLE, "jax", "1", 1.0)]), aa=True)
    assert bench.merge(previous, doc) is doc


def test_an_aa_table_says_it_measures_stock_twice():
    doc = dict(_doc([_row(MLP, "jax", "1", 1.1)]), aa=True)
    assert "A/A run: the fork column is stock again" in bench.render_table(doc)


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
    from keras_fork import bench_worker

    stock = bench_worker.canonical_hlo(HLO)
    assert len(stock) == 3
    # The same program from another install, emitted by other lines.
    moved = HLO.replace("/a/stock/", "/a/fork/").replace("=462", "=476")
    assert bench_worker.canonical_hlo(moved) == stock
    # One more op is a different program.
    extra = HLO.replace(
        "  %c.2 = f32[] constant(0)\n",
        "  %c.2 = f32[] constant(0)\n  %n.5 = f32[2]{0} negate(%p.1)\n",
    )
    assert len(bench_worker.canonical_hlo(extra)) == 4


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
    table = bench.render_work_table(doc)
    assert "| 400.0 | 402.0 | +2.0 | same XLA HLO (245 ops) |" in table
    assert "| differs: XLA HLO 245/251 ops |" in table
    assert "| 100.0 | 99.5 | -0.5 | - (eager) |" in table


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
    fork = prove.install_variants(layout, base)["fork"]
    result = bench._run_worker(
        fork, prove.install_overlay(layout, base), "fit_step", backend, "1",
        {"samples": 256, "batch_size": 64, "epochs": 2, "work": True},
        "cpu",
    )  # fmt: skip
    assert len(result["calls_per_step"]) == 2
    assert min(result["calls_per_step"]) > 0
    assert result["graph"]["kind"] == kind
    assert result["graph"]["ops"] > 0
