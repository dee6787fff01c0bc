"""The benchmark's results document: merging a run of some cases."""

from keras_fork import bench


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
