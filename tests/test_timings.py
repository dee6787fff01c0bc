"""Where a test run's time went: the stage record and the matrix runs."""

import json

import pytest

from keras_fork import cli
from keras_fork.errors import ForkError
from keras_fork.proof import timings
from keras_fork.recipe import pins


def _junit(path, *times):
    cases = "".join(
        f'<testcase name="t{i}" time="{t}"/>' for i, t in enumerate(times)
    )
    path.write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")


def _run(name, seconds, junit, multi=False, cells=1):
    return {
        "run": name,
        "cells": cells,
        "multi_process": multi,
        "outcome": "pass",
        "seconds": seconds,
        "junit": junit,
    }


def test_the_breakdown_of_a_run(tmp_path):
    layout = pins.Layout.default(tmp_path)
    dist = layout.dist
    (dist / "j").mkdir(parents=True)
    (dist / timings.STAGES_FILE).write_text(
        "install\t100.0\t110.5\nproof matrix\t110.5\t210.5\n"
    )
    _junit(dist / "j" / "a.xml", 3.0, 1.0)
    _junit(dist / "j" / "b.xml", 20.0)
    _junit(dist / "j" / "shared.xml", 30.0)
    runs = [
        _run("a", 10.0, "dist/j/a.xml"),
        _run("b", 25.0, "dist/j/b.xml", multi=True),
        _run("shared", 40.0, "dist/j/shared.xml", cells=2),
    ]
    (dist / "proof.json").write_text(json.dumps({"cells": [], "runs": runs}))
    args = cli.parser().parse_args(["timings", "--jobs", "2"])
    assert timings.main(args, layout) == 0
    got = json.loads((dist / "timings.json").read_text())
    assert got["stages"] == [
        {"name": "install", "seconds": 10.5},
        {"name": "proof matrix", "seconds": 100.0},
    ]
    m = got["matrix"]
    assert m["runs"] == 3
    assert m["single_process"] == {
        "runs": 2,
        "seconds": 50.0,
        "tests": 34.0,
        "overhead": 16.0,
    }
    assert m["multi_process"] == {
        "runs": 1,
        "seconds": 25.0,
        "tests": 20.0,
        "overhead": 5.0,
    }
    # 2 slots x 100 s, less 50 s of single runs and 2 x 25 s of the
    # multi-process run, which holds both slots.
    assert m["idle_slot_seconds"] == 100.0
    assert got["longest_runs"][0]["seconds"] == 40.0


def test_no_record_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["--root", str(tmp_path), "timings"]) == 2
    assert "run scripts/test first" in capsys.readouterr().err


def test_a_bad_stage_line_is_named(tmp_path):
    path = tmp_path / "stages.tsv"
    path.write_text("lint\t1,5\t2\n")
    with pytest.raises(ForkError, match="stages.tsv:1"):
        timings.read_stages(path)
