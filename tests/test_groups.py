"""One run per base, variant, backend and topology keeps each cell's
verdict its own: the harness's own fake fixes, run for real by the proof
runner (no keras needed), one passing, one failing, one hung past its test
timeout and one stuck where the timeout cannot reach it."""

import dataclasses
import textwrap
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from keras_fork.bench import matrix
from keras_fork.proof import cells as cells_lib
from keras_fork.proof import groups
from keras_fork.proof import prove
from keras_fork.proof import runner
from keras_fork.recipe import pins

TESTS = {
    "good": "def test_good():\n    assert 1 + 1 == 2\n",
    "failing": "def test_failing():\n    assert 1 + 1 == 3, 'planted'\n",
    # pytest-timeout interrupts the sleep: the test fails, the run goes on.
    "hung": "import time\n\ndef test_hung():\n    time.sleep(600)\n",
    # SIGALRM blocked: pytest-timeout cannot interrupt it, only the runner's
    # watchdog (no progress for timeout + grace) can.
    "stuck": textwrap.dedent("""\
        import signal
        import time

        def test_stuck():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(600)
        """),
}
CONFTEST = """\
from integration_tests.harness import selection

pytest_collection_modifyitems = selection.pytest_collection_modifyitems
"""
TIMEOUT, GRACE = 3, 2


@pytest.fixture
def fake_fixes(tmp_path):
    folder = tmp_path / "fixes"
    folder.mkdir()
    (folder / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    fix(name): the fix a test proves\n"
    )
    (folder / "conftest.py").write_text(CONFTEST)
    for fix, body in TESTS.items():
        (folder / fix).mkdir()
        marked = body.replace(
            "def test_", f"@pytest.mark.fix({fix!r})\ndef test_", 1
        )
        (folder / fix / f"test_{fix}.py").write_text("import pytest\n" + marked)
    return folder


def _plan(tmp_path, fixes_wanted, variants):
    cells = [
        cells_lib.Cell("1.0", fix, "", "jax", "1", "guard")
        for fix in fixes_wanted
    ]
    keras_dir = tmp_path / "keras"
    keras_dir.mkdir(exist_ok=True)
    return prove.Plan(
        cells=cells,
        accelerator="cpu",
        bases={"1.0": SimpleNamespace(version="1.0", fork_version="1.0+f")},
        installed={"1.0": {v: keras_dir for v in variants}},
        overlays={"1.0": None},
        units={},
        groups=groups.plan_groups(cells, {}, variants),
        jobs=2,
    )


def test_each_fix_fails_only_its_own_cell(fake_fixes, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "GRACE", GRACE)
    layout = pins.Layout.default(tmp_path)
    layout = dataclasses.replace(layout, fixes=fake_fixes)
    p = _plan(tmp_path, TESTS, ["fork"])
    cells = p.cells
    rows = {c.key: {"runs": {}} for c in cells}
    args = SimpleNamespace(timeout=TIMEOUT)
    start = time.monotonic()
    runs = prove.execute(p, rows, args, layout, Console(quiet=True))
    took = time.monotonic() - start
    got = {c.fix: rows[c.key]["runs"]["fork"] for c in cells}

    assert got["good"]["outcome"] == "pass"
    assert got["failing"]["outcome"] == "fail"
    assert "planted" in got["failing"]["detail"]
    assert got["hung"]["outcome"] == "fail"
    assert "Timeout" in got["hung"]["detail"]
    stuck = got["stuck"]
    assert stuck["outcome"] == "error"
    assert stuck["detail"].startswith("stuck/test_stuck.py::test_stuck did")
    assert "without progress" in stuck["detail"]
    # The shared run died in test_stuck; each other cell ran on its own.
    assert [r["cells"] for r in runs] == [4, 1, 1, 1]
    for fix, result in got.items():
        log = layout.root / result["log"]
        assert log.is_file(), fix
    hung_log = (layout.root / got["hung"]["log"]).read_text()
    assert "test_hung" in hung_log and "Timeout" in hung_log
    # Bounded: the shared run is killed TIMEOUT + GRACE s after test_stuck
    # starts, then the three reruns go two at a time, the longest (test_hung)
    # failing after TIMEOUT s; the rest is pytest's own start-up.
    assert took < 2 * (TIMEOUT + GRACE) + 30


def test_bench_matrix_runs_both_ways_to_the_same_verdicts(fake_fixes, tmp_path):
    layout = dataclasses.replace(
        pins.Layout.default(tmp_path), fixes=fake_fixes
    )
    p = _plan(tmp_path, ["good", "failing"], ["stock", "fork"])
    args = SimpleNamespace(timeout=TIMEOUT, variant=None)
    console = Console(quiet=True)
    old = matrix.measure(p, "per cell", args, layout, console)
    new = matrix.measure(p, "grouped", args, layout, console)
    assert (old["processes"], new["processes"]) == (4, 2)
    # good passes on both (guard); failing fails on both (broken).
    assert (
        old["verdicts"]
        == new["verdicts"]
        == {
            "1.0/good/jax/1": "guard",
            "1.0/failing/jax/1": "broken",
        }
    )
    assert (layout.dist / "bench-matrix" / "per-cell").is_dir()


def test_bench_matrix_gc_way_reaches_the_test_processes(fake_fixes, tmp_path):
    """``grouped, no gc.freeze`` sets the harness's ``PROOF_GC_FREEZE=0``
    in every test process, and ``grouped`` does not: a probe test that
    passes only with it is a guard one way and broken the other."""
    (fake_fixes / "probe").mkdir()
    (fake_fixes / "probe" / "test_probe.py").write_text(
        textwrap.dedent("""\
            import os

            import pytest

            @pytest.mark.fix("probe")
            def test_probe():
                assert os.environ.get("PROOF_GC_FREEZE") == "0"
            """)
    )
    layout = dataclasses.replace(
        pins.Layout.default(tmp_path), fixes=fake_fixes
    )
    p = _plan(tmp_path, ["probe"], ["stock", "fork"])
    args = SimpleNamespace(timeout=TIMEOUT, variant=None)
    console = Console(quiet=True)
    gc = matrix.measure(p, "grouped, no gc.freeze", args, layout, console)
    now = matrix.measure(p, matrix.NOW, args, layout, console)
    assert gc["processes"] == now["processes"] == 2
    assert gc["verdicts"] == {"1.0/probe/jax/1": "guard"}
    assert now["verdicts"] == {"1.0/probe/jax/1": "broken"}


def test_collection_freezes_the_heap_unless_told_not_to(monkeypatch):
    """The proof suite's conftest freezes what is alive after collection
    (``gc.freeze``: each test's ``gc.collect()`` then skips it), and leaves
    the heap as it is under ``PROOF_GC_FREEZE=0`` (``bench-matrix``'s old
    way)."""
    import gc

    from integration_tests import conftest
    from integration_tests.harness import plugin

    gc.unfreeze()
    try:
        monkeypatch.setenv(plugin.GC_FREEZE_ENV, "0")
        conftest.pytest_collection_finish(None)
        assert gc.get_freeze_count() == 0
        monkeypatch.delenv(plugin.GC_FREEZE_ENV)
        conftest.pytest_collection_finish(None)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
