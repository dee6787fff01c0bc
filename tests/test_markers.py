"""The ``topology`` marker: which topologies a proof test runs on, decided
at collection from the environment, with a reason in one of three
categories; skipped cases still carry their fix and role."""

import os
import subprocess
import sys
import textwrap

import pytest

from integration_tests.harness import junit
from integration_tests.harness import markers
from keras_fork.recipe import pins


class _Item:
    """What ``markers.skip_reason`` reads of a pytest item."""

    nodeid = "test_x.py::test_x"

    def __init__(self, *marks):
        self.marks = [m.mark for m in marks]

    def iter_markers(self, name):
        # pytest's order: closest first (the last decorator applied).
        return reversed([m for m in self.marks if m.name == name])


def _reason(backend, name, *marks):
    return markers.skip_reason(_Item(*marks), markers.Cell(backend, name))


DP_2 = pytest.mark.topology("dp-2")


@pytest.mark.parametrize(
    "backend, name, expected",
    [
        ("torch", "dp-2", None),
        ("torch", "ddp-2", "not applicable on this topology"),
        ("torch", "1", "too few devices"),
        ("jax", "8", "wrong backend"),
    ],
)
def test_a_named_topology_runs_there_only(backend, name, expected):
    reason = _reason(backend, name, DP_2)
    if expected is None:
        assert reason is None
    else:
        assert reason == f"{expected}: runs on topology dp-2 only"


@pytest.mark.parametrize(
    "mark, runs_on",
    [
        (pytest.mark.topology(multi_process=True), {"ddp-2", "dp-2"}),
        (pytest.mark.topology(multi_process=False), {"1"}),
        (pytest.mark.topology(multi_replica=True), {"ddp-2", "dp-2"}),
        (pytest.mark.topology(exclude="ddp-2"), {"1", "dp-2"}),
        (
            pytest.mark.topology(backend=("jax", "torch")),
            {"1", "ddp-2", "dp-2"},
        ),
        (pytest.mark.topology("1", "dp-2"), {"1", "dp-2"}),
    ],
)
def test_conditions_on_torch(mark, runs_on):
    ran = {n for n in ("1", "ddp-2", "dp-2") if not _reason("torch", n, mark)}
    assert ran == runs_on


def test_a_strategy_is_tensorflow_mirrored_n():
    mark = pytest.mark.topology(strategy=True, reason="why")
    assert _reason("tensorflow", "mirrored-2", mark) is None
    assert _reason("tensorflow", "multiworker-2", mark) == (
        "not applicable on this topology: why"
    )
    assert _reason("tensorflow", "1", mark) == "too few devices: why"
    assert _reason("jax", "8", mark) == "wrong backend: why"


def test_the_first_category_then_reading_order_gives_the_reason():
    module = pytest.mark.topology(backend="tensorflow", reason="tf only")
    strategy = pytest.mark.topology(strategy=True, reason="a strategy")
    # Both are wrong on jax: the first in reading order (the module's).
    assert _reason("jax", "8", module, strategy) == "wrong backend: tf only"
    # On tensorflow/1 only the strategy's holds.
    single = pytest.mark.topology(multi_replica=False, reason="one replica")
    assert _reason("tensorflow", "1", module, strategy) == (
        "too few devices: a strategy"
    )
    assert _reason("tensorflow", "mirrored-2", single, strategy) == (
        "not applicable on this topology: one replica"
    )


@pytest.mark.parametrize(
    "mark",
    [
        pytest.mark.topology("dp2"),
        pytest.mark.topology(exclude="ddp2"),
        pytest.mark.topology(backend="numpy"),
        pytest.mark.topology(multiprocess=True),
        pytest.mark.topology(strategy="yes"),
        pytest.mark.topology(reason="no condition"),
    ],
)
def test_a_bad_marker_is_a_usage_error(mark):
    with pytest.raises(pytest.UsageError):
        _reason("torch", "1", mark)


CONFTEST = """\
from integration_tests.harness import markers
from integration_tests.harness import selection


def pytest_configure(config):
    markers.register(config)


def pytest_collection_modifyitems(config, items):
    selection.pytest_collection_modifyitems(config, items)
    markers.pytest_collection_modifyitems(config, items)
"""
TESTS = """\
import pytest

pytestmark = pytest.mark.fix("f")


@pytest.mark.topology("dp-2")
def test_dp():
    pass


@pytest.mark.fix("f", role="guard")
@pytest.mark.topology(multi_process=False, reason="one process")
def test_one_process():
    pass
"""


def test_collection_skips_with_the_reason_and_keeps_fix_and_role(tmp_path):
    """Run for real (no keras): on torch/ddp-2 the test for dp-2 and the
    single-process test are skipped at collection, each with its reason,
    and their JUnit cases still carry their fix and role (the runner gives
    a cell its cases by fix); on torch/dp-2 the first runs."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_f.py").write_text(textwrap.dedent(TESTS))
    cases = {}
    for name in ("ddp-2", "dp-2"):
        env = dict(
            os.environ,
            KERAS_BACKEND="torch",
            PROOF_TOPOLOGY=name,
            PYTHONPATH=str(pins.CODE_ROOT),
        )
        env.pop("PROOF_FIX", None)
        xml = tmp_path / f"{name}.xml"
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
            + ["--strict-markers", "-rs", f"--junitxml={xml}", "test_f.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        cases[name] = {c["name"]: c for c in junit.read_junit(xml).cases}
    assert "not applicable on this topology: one process" in proc.stdout
    ddp = cases["ddp-2"]
    assert [ddp[t]["outcome"] for t in ("test_dp", "test_one_process")] == [
        "skipped",
        "skipped",
    ]
    assert (ddp["test_dp"]["fix"], ddp["test_dp"]["role"]) == ("f", "proof")
    guard = ddp["test_one_process"]
    assert (guard["fix"], guard["role"]) == ("f", "guard")
    dp = cases["dp-2"]
    assert dp["test_dp"]["outcome"] == "passed"
    assert (dp["test_dp"]["fix"], dp["test_dp"]["role"]) == ("f", "proof")
