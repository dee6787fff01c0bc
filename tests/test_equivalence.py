"""The equivalence suite's parts that need no backend: the comparison of
two runs' results (``cells.compare``), the feature catalog, and the
table's merging and rendering (``keras_fork.proof.equivalence``)."""

import json

import numpy as np
import pytest

from integration_tests.equivalence import cells
from integration_tests.equivalence import features
from keras_fork.proof import equivalence


def _feature(rtol=1e-5, atol=1e-6):
    return features.Feature("test/x", run=None, rtol=rtol, atol=atol)


def test_results_within_tolerance_are_equal():
    expected = {"weights": np.array([1.0, 2.0]), "history/loss": [0.5]}
    actual = {"weights": np.array([1.0 + 1e-7, 2.0]), "history/loss": [0.5]}
    assert cells.compare(actual, expected, _feature()) is None


def test_the_worst_result_is_named_with_its_difference():
    expected = {"weights": np.array([1.0, 2.0]), "history/loss": [0.5]}
    actual = {"weights": np.array([1.0, 2.1]), "history/loss": [0.25]}
    text = cells.compare(actual, expected, _feature(), "process 1: ")
    assert text.startswith("process 1: history/loss: max |diff| 0.25")
    assert "[0.25] vs [0.5]" in text


def test_nan_against_a_number_differs_and_nan_against_nan_is_equal():
    assert cells.compare({"a": [np.nan]}, {"a": [1.0]}, _feature())
    assert cells.compare({"a": [np.nan]}, {"a": [np.nan]}, _feature()) is None


def test_shapes_and_extra_results_differ():
    assert "shape" in cells.compare(
        {"p": np.ones((2, 1))}, {"p": np.ones((1, 1))}, _feature()
    )
    assert "does not have" in cells.compare(
        {"p": [1.0], "q": [1.0]}, {"p": [1.0]}, _feature()
    )


def test_a_result_only_one_device_has_is_not_compared():
    # predict is not asked of a process feeding part of the data.
    assert (
        cells.compare({"w": [1.0]}, {"w": [1.0], "predict": [2.0]}, _feature())
        is None
    )


def test_every_feature_has_a_group_and_a_runner():
    assert len(features.FEATURES) >= 30
    for name, feature in features.FEATURES.items():
        group, _, rest = name.partition("/")
        assert group and rest, name
        assert callable(feature.run), name
        assert feature.rtol > 0 and feature.atol > 0, name


def test_a_local_feed_gives_each_process_its_part_of_each_global_batch():
    x = np.arange(features.NUM_SAMPLES)
    feed = features.Feed(None, None, rank=1, world_size=2, local=True)
    (part, none), batch = feed.batches(x, None)
    assert none is None and batch == features.GLOBAL_BATCH // 2
    assert part[:4].tolist() == [4, 5, 6, 7]


def _cell(variant, verdict, feature="optimizer/adam", detail=""):
    return dict(
        base="3.15.1",
        variant=variant,
        backend="jax",
        topology="8",
        feature=feature,
        verdict=verdict,
        detail=detail,
        seconds=1.0,
    )


def test_a_run_replaces_its_cells_and_keeps_the_others(tmp_path):
    path = tmp_path / "equivalence.json"
    old = [_cell("stock", "differs"), _cell("fork", "equal", "metric/auc")]
    path.write_text(json.dumps({"cells": old}))
    merged = equivalence.merge(path, [_cell("stock", "equal")])
    verdicts = {(c["variant"], c["feature"]): c["verdict"] for c in merged}
    assert verdicts == {
        ("stock", "optimizer/adam"): "equal",
        ("fork", "metric/auc"): "equal",
    }


def test_the_table_shows_stock_then_fork_and_lists_what_is_not_equal():
    text = equivalence.render(
        [
            _cell("stock", "differs", detail="weights: max |diff| 0.1"),
            _cell("fork", "equal"),
        ]
    )
    assert "| `optimizer/adam` | differs / equal |" in text
    assert "- `optimizer/adam` jax/8 stock: differs: weights: max" in text


def test_an_unknown_feature_is_refused():
    from keras_fork.errors import ForkError

    with pytest.raises(ForkError, match="unknown feature"):
        equivalence._wanted_features(["optimizer/nope"])


def test_the_table_names_the_keras_it_measured_and_when():
    stock = dict(_cell("stock", "equal"), keras="3.15.1", date="2026-12-01")
    fork = dict(
        _cell("fork", "equal"), keras="3.15.1+fork.27", date="2026-12-03"
    )
    text = equivalence.render([stock, fork])
    assert "stock: 3.15.1 (1 cells), run 2026-12-01" in text
    assert "fork: 3.15.1+fork.27 (1 cells), run 2026-12-03" in text


def test_the_installed_version_is_read_from_the_dist_info(tmp_path):
    assert equivalence.installed_version(tmp_path) == "?"
    (tmp_path / "keras-3.15.1+fork.27.dist-info").mkdir()
    assert equivalence.installed_version(tmp_path) == "3.15.1+fork.27"
