"""The multi-process harness: results, failures, timeouts, no orphans."""

import json
import os
import sys
import time

import pytest

from integration_tests.harness import workers


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_results_come_back_by_rank():
    out = workers.run_workers("tests.mp_targets:echo", world_size=2)
    assert [(r["rank"], r["world"]) for r in out] == [(0, 2), (1, 2)]
    assert not any(_alive(r["pid"]) for r in out)


def test_failing_worker_is_named_and_the_others_are_killed():
    start = time.monotonic()
    with pytest.raises(workers.WorkerError) as e:
        workers.run_workers(
            "tests.mp_targets:crash_on_rank_1", world_size=2, timeout=120
        )
    assert time.monotonic() - start < 60  # did not wait for the timeout
    assert "worker 1/2" in str(e.value)
    assert "status 1" in str(e.value)
    assert "rank 1 broke on purpose" in str(e.value)


def test_hanging_workers_time_out_and_leave_no_orphans(tmp_path):
    with pytest.raises(workers.WorkerError, match="still running"):
        workers.run_workers(
            "tests.mp_targets:hang",
            world_size=2,
            timeout=5,
            env={"PID_DIR": str(tmp_path)},
        )
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(pids) == 2
    assert not any(_alive(p) for p in pids)


def test_a_worker_without_a_result_after_a_peer_returned_is_named(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(workers, "STRAGGLER_MIN_S", 1.0)
    start = time.monotonic()
    with pytest.raises(
        workers.WorkerError, match=r"workers \[1\] .* no result"
    ):
        workers.run_workers(
            "tests.mp_targets:return_on_rank_0_hang_rank_1",
            world_size=2,
            timeout=120,
            env={"PID_DIR": str(tmp_path)},
        )
    assert time.monotonic() - start < 60  # did not wait for the timeout
    assert not _alive(int((tmp_path / "1").read_text()))


def test_free_port_is_on_loopback_and_bindable():
    import socket

    port = workers.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_tf_config_names_every_worker_on_loopback_with_its_own_port():
    configs = [
        json.loads(c)
        for c in workers.run_workers(
            "tests.mp_targets:tf_config", world_size=3, timeout=60
        )
    ]
    cluster = configs[0]["cluster"]["worker"]
    assert len(cluster) == 3 and len(set(cluster)) == 3
    assert all(w.startswith("127.0.0.1:") for w in cluster)
    for rank, config in enumerate(configs):
        assert config["cluster"]["worker"] == cluster
        assert config["task"] == {"type": "worker", "index": rank}


def test_kill_at_signal_kills_the_worker_when_it_asks(tmp_path):
    status = workers.kill_at_signal(
        "tests.mp_targets:signal_mid_work",
        timeout=60,
        env={"PID_DIR": str(tmp_path)},
    )
    assert status == -9
    pid = int((tmp_path / "victim").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_kill_at_signal_reports_a_worker_that_exits_first():
    with pytest.raises(workers.WorkerError, match="status 3 before"):
        workers.kill_at_signal("tests.mp_targets:exit_early", timeout=60)


def test_start_worker_own_session_env_over_ours_log_and_result(
    monkeypatch, tmp_path
):
    """The one way both run_workers and kill_at_signal start a worker."""
    monkeypatch.setenv("MP_OUTER", "kept")
    monkeypatch.setenv("RANK", "99")
    env = {"RANK": "0", "WORLD_SIZE": "1"}
    # The worker reports what it sees: /proc/<pid>/environ, read right after
    # Popen returns, can still be empty (exec has not set it up yet).
    proc = workers._start_worker("tests.mp_targets:environ", 0, tmp_path, env)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        workers.kill_groups([proc])
    result = json.loads((tmp_path / "result-0.json").read_text())
    assert result["sid"] == result["pid"]  # its group can be killed
    seen = result["env"]
    assert seen["MP_OUTER"] == "kept" and seen["RANK"] == "0"
    assert seen["WORKER_RESULT"] == str(tmp_path / "result-0.json")
    assert (tmp_path / "worker-0.log").exists()


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_workers_run_their_atexit_handlers_either_way(tmp_path, start):
    """A forked worker ends as ``python -m`` would: its atexit handlers run
    (JAX's shutdown barrier is one). ``spawn`` starts a fresh interpreter,
    a child of this process; ``forkserver`` forks it from the fork server."""
    parents = workers.run_workers(
        "tests.mp_targets:register_atexit",
        world_size=2,
        timeout=60,
        env={"PID_DIR": str(tmp_path), "PROOF_WORKER_START": start},
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "atexit-0",
        "atexit-1",
    ]
    if start == "spawn":
        assert parents == [os.getpid()] * 2
    else:
        assert os.getpid() not in parents


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_a_failed_worker_skips_its_atexit_handlers(start):
    """A worker that fails exits at once, without its atexit handlers: one
    that waits forever (JAX's shutdown barrier, for a peer stuck in a
    collective) would otherwise hold the run until its timeout."""
    start_s = time.monotonic()
    with pytest.raises(workers.WorkerError) as e:
        workers.run_workers(
            "tests.mp_targets:fail_behind_a_blocking_atexit",
            world_size=2,
            timeout=120,
            env={"PROOF_WORKER_START": start},
        )
    assert time.monotonic() - start_s < 60  # did not wait for the timeout
    assert "worker 1/2" in str(e.value)
    assert "checked its result and failed" in str(e.value)


def test_a_worker_for_another_keras_is_spawned(monkeypatch):
    """The fork server preloaded the keras of one ``PYTHONPATH`` and
    ``KERAS_BACKEND``; a worker whose environment names another is started
    fresh (a child of this process) instead of forked from it."""
    (first,) = workers.run_workers("tests.mp_targets:parent", 1, 60)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", *sys.path]))
    (other,) = workers.run_workers("tests.mp_targets:parent", 1, 60)
    assert other == os.getpid() != first


def test_a_torch_worker_on_gpus_is_spawned(monkeypatch):
    """Importing keras's torch backend initializes CUDA where a GPU is
    present, and a process forked after that cannot use CUDA (the first GPU
    run's torch/1 cells failed so), so under ``PROOF_ACCELERATOR=gpu`` a
    torch worker starts fresh; on CPU it still forks."""
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    env = {"KERAS_BACKEND": "torch", "PYTHONPATH": os.environ.get("PYTHONPATH")}
    monkeypatch.setattr(workers, "_SERVER_ENV", None)
    assert workers._fork_server_for(env) is not None
    gpu = dict(env, PROOF_ACCELERATOR="gpu")
    assert workers._fork_server_for(gpu) is None
    jax = dict(gpu, KERAS_BACKEND="jax")
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setattr(workers, "_SERVER_ENV", None)
    assert workers._fork_server_for(jax) is not None
