"""Run a test function in N worker processes (torch DDP, JAX multi-process).

``run_workers("integration_tests.fixes.x.test_x:worker_fn", world_size=2)``
starts ``python -m integration_tests.harness.workers`` once per rank. Each
worker gets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1`` and a free
``MASTER_PORT`` (found by binding port 0 on 127.0.0.1), plus ``WORKER_PORTS``
(one free port per rank, for rendezvous that address every worker, like
TensorFlow's ``TF_CONFIG``: see ``tf_config``), calls the function with
``(rank, world_size)`` and writes its JSON-able return value to a file.

Under ``PROOF_ACCELERATOR=gpu`` each worker gets one GPU of its own
(``CUDA_VISIBLE_DEVICES``, rank ``r`` the ``r``-th visible GPU), and torch
process groups use NCCL instead of gloo (``torch_process_group``).

Workers start from a fork server (``multiprocessing``'s ``forkserver``,
one per test process): a process that has imported keras and its backend,
without starting it (no device, no thread pool yet), so a worker runs its
function about 0.1 s after the call instead of after 2.5 (jax) to 7.7 s
(torch) of imports. Each worker is still its own process with its own
session, environment and log; ``PROOF_WORKER_START=spawn`` starts a fresh
interpreter per worker instead (``python -m integration_tests.harness
.workers``), as does a call whose ``KERAS_BACKEND`` or ``PYTHONPATH``
differs from the fork server's, and a torch worker on GPUs (importing
keras's torch backend initializes CUDA, which a forked process cannot use).

Failure handling follows the MultiProcessTestCase rules: the first worker
that exits non-zero, or the deadline, ends the run; every worker's whole
process group is killed; the error names the worker, its exit status and
the tail of its log. A run also ends once some worker has returned its
result and another has not returned its own after as long again as the
first took (at least ``STRAGGLER_MIN_S``): it is stuck, typically in a
collective that the returned worker will not join. Waits are bounded;
there is no sleep-based synchronization (workers meet in their
framework's own rendezvous).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import multiprocessing
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from . import run
from . import topologies


class WorkerError(AssertionError):
    """A worker failed or the run timed out; the message says which/why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked (bind to port 0).

    The rendezvous binds it right after; a lost race shows up as "address
    already in use" in the worker log.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_gpus(world_size: int) -> list[dict]:
    """The GPU environment of each rank: under ``PROOF_ACCELERATOR=gpu``,
    ``CUDA_VISIBLE_DEVICES`` naming one GPU a rank, the ``rank``-th of
    this process's visible GPUs (``run.visible_gpus``); else none
    (workers inherit this process's devices, on CPU none).

    Returns:
        ``world_size`` dicts of environment variables, indexed by rank.

    Raises:
        WorkerError: fewer visible GPUs than ranks.
    """
    if not topologies.on_gpu():
        return [{} for _ in range(world_size)]
    gpus = run.visible_gpus()
    if topologies.shared_gpu() and gpus:  # one-GPU mode: all on the first
        return [{"CUDA_VISIBLE_DEVICES": gpus[0]}] * world_size
    if len(gpus) < world_size:
        raise WorkerError(
            f"{world_size} workers need one GPU each; this process sees "
            f"{len(gpus)} ({','.join(gpus) or 'none'})"
        )
    return [{"CUDA_VISIBLE_DEVICES": gpus[rank]} for rank in range(world_size)]


def collective_backend() -> str:
    """The ``torch.distributed`` backend of the workers: ``nccl`` under
    ``PROOF_ACCELERATOR=gpu``, where each worker has one GPU
    (``worker_gpus``), else ``gloo``: CPU tensors, or CUDA tensors in
    one-GPU mode (``topologies.SHARED_GPU``), where NCCL would refuse two
    ranks on one GPU. Source:
    https://pytorch.org/docs/stable/distributed.html#which-backend-to-use
    """
    if topologies.on_gpu() and not topologies.shared_gpu():
        return "nccl"
    return "gloo"


def kill_groups(procs) -> None:
    """SIGKILLs the whole process group of each running worker of ``procs``
    (each started in its own session) and reaps them all. A worker that
    has no group of its own yet (forked, before its ``setsid``) is killed
    alone."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-n:])
    except OSError:
        return "(no log)"


# What the fork server imported: the keras of this PYTHONPATH and backend.
_PRELOADED = ("KERAS_BACKEND", "PYTHONPATH")
_SERVER_ENV = None


class _Forked:
    """A worker forked by the fork server, with the part of ``Popen``'s
    interface the harness uses (``pid``, ``poll``, ``wait``,
    ``returncode``: ``-N`` when killed by signal N)."""

    def __init__(self, process):
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self):
        return self._process.exitcode

    def poll(self):
        return self._process.exitcode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self._process.exitcode


def _forked_main(target: str, env: dict, log: str) -> None:
    """The first thing a forked worker runs: its own session, its log on
    stdout and stderr, exactly ``env`` as its environment, then ``target``
    (``_run``: a success runs the ``atexit`` handlers, a failure exits at
    once).

    The handlers matter on success: ``multiprocessing`` ends a child with
    ``os._exit``, which skips them, and JAX's handler
    (``jax.distributed.shutdown``) is the barrier that keeps the
    coordinating process alive until every process is done; without it
    the other one aborts ("another task died").
    """
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    _run(target)


def _run(target: str) -> None:
    """Runs ``target`` in this worker and ends the process.

    Exit status 0 after the ``atexit`` handlers, or 1 (``SystemExit``'s own
    status) right after the traceback, without them: a failed worker must
    not wait in JAX's shutdown barrier for a peer that may be stuck in a
    collective, so ``run_workers`` sees the failure at once, names the
    worker and kills the group.
    """
    code = 0
    try:
        _main(target)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    if code == 0:
        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _fork_server_for(env: dict):
    """The ``forkserver`` context to fork a worker with ``env`` from, or
    None where it must spawn (``PROOF_WORKER_START=spawn``; ``env`` needs
    another keras or backend than the server preloaded; or a torch worker
    on GPUs).

    Importing keras's torch backend calls ``torch.cuda.is_available()``,
    which initializes CUDA in the fork server when a GPU is present, and
    CUDA cannot be used in a process forked after that ("Cannot
    re-initialize CUDA in forked subprocess",
    https://pytorch.org/docs/stable/notes/multiprocessing.html): seen on
    the first GPU run (docs/gpu.md). JAX does not start its backend at
    import, so its workers still fork on GPUs.
    """
    global _SERVER_ENV
    if env.get("PROOF_WORKER_START", "forkserver") == "spawn":
        return None
    if (
        env.get(topologies.ACCELERATOR_ENV) in ("gpu", topologies.SHARED_GPU)
        and env.get("KERAS_BACKEND") == "torch"
    ):
        return None
    key = {k: os.environ.get(k) for k in _PRELOADED}
    if _SERVER_ENV is None:
        _SERVER_ENV = key
        # The server starts with this process's environment, at first use.
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["keras", __name__])
    if key != _SERVER_ENV or any(env.get(k) != key[k] for k in _PRELOADED):
        return None
    return multiprocessing.get_context("forkserver")


def _start_worker(target: str, rank: int, folder: Path, env: dict):
    """Starts rank ``rank`` of ``target`` in its own session (so its whole
    group can be killed), with ``env`` over this process's environment,
    ``WORKER_RESULT`` in ``folder`` and its output in
    ``folder/worker-<rank>.log``: forked from the fork server, or
    ``python -m integration_tests.harness.workers target`` (see the module
    docstring)."""
    wenv = dict(os.environ, **env)
    wenv["WORKER_RESULT"] = str(folder / f"result-{rank}.json")
    log_path = folder / f"worker-{rank}.log"
    ctx = _fork_server_for(wenv)
    if ctx is not None:
        process = ctx.Process(
            target=_forked_main,
            args=(target, wenv, str(log_path)),
            name=f"worker-{rank}",
        )
        process.start()
        return _Forked(process)
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", __name__, target],
            env=wenv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_workers(
    target: str,
    world_size: int = 2,
    timeout: float = 300,
    env: dict | None = None,
) -> list:
    """Runs ``target`` (``"module:function"``) on ``world_size`` ranks.

    Args:
        target: the function, called as ``fn(rank, world_size)`` in each
            worker; it returns a JSON-serializable value.
        world_size: number of worker processes.
        timeout: seconds for the whole run (all workers).
        env: extra environment variables for every worker.

    Returns:
        The return values, indexed by rank.

    Raises:
        WorkerError: a worker exited non-zero (named, with exit status and
            log tail) or the run exceeded ``timeout``; all workers are
            killed first. On GPUs, fewer GPUs than workers (none started).
    """
    gpus = worker_gpus(world_size)
    port = free_port()
    worker_ports = ",".join(str(free_port()) for _ in range(world_size))
    with tempfile.TemporaryDirectory(prefix="workers.") as tmp:
        tmp = Path(tmp)
        procs = []
        try:
            for rank in range(world_size):
                wenv = dict(
                    {**gpus[rank], **(env or {})},
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(world_size),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    WORKER_PORTS=worker_ports,
                )
                procs.append(_start_worker(target, rank, tmp, wenv))
            _wait_all(procs, target, tmp, timeout)
        finally:
            kill_groups(procs)
        return [
            json.loads((tmp / f"result-{r}.json").read_text())
            for r in range(world_size)
        ]


# A worker that has returned its result waits for the others (JAX: in its
# shutdown barrier). One that has not returned its own once the run is
# twice as old as it was when the first result came back (and at least
# STRAGGLER_MIN_S after it) is stuck, in the cases seen here in a
# collective that a returned worker will not join: the run ends then
# instead of at its timeout.
STRAGGLER_MIN_S = 20.0


def _straggler_deadline(first_result_age: float) -> float:
    """Seconds after the first result before the workers that have not
    returned one are stuck: the run's age at that result, at least
    ``STRAGGLER_MIN_S``."""
    return max(STRAGGLER_MIN_S, first_result_age)


def _wait_all(procs, target: str, folder: Path, timeout: float) -> None:
    """Waits for every worker to exit 0, at most ``timeout`` seconds.

    Raises:
        WorkerError: the first worker that exits non-zero (named, with its
            exit status and log tail), the workers that have not returned
            a result ``_straggler_deadline()`` after the first worker
            returned its own, or the workers still running at the
            deadline.
    """
    world_size = len(procs)
    start = time.monotonic()
    deadline = start + timeout
    pending = set(range(world_size))
    first = first_at = None  # the first worker that returned, and when
    while pending:
        for rank in sorted(pending):
            try:
                code = procs[rank].wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            pending.discard(rank)
            if code != 0:
                raise WorkerError(
                    f"worker {rank}/{world_size} of {target} exited "
                    f"with status {code}:\n"
                    f"{_tail(folder / f'worker-{rank}.log')}"
                )
        now = time.monotonic()
        stuck = [
            r
            for r in range(world_size)
            if not (folder / f"result-{r}.json").exists()
        ]
        if first is None and len(stuck) < world_size:
            first = min(set(range(world_size)) - set(stuck))
            first_at = now
        if (
            stuck
            and first is not None
            and now - first_at > _straggler_deadline(first_at - start)
        ):
            raise WorkerError(
                f"workers {stuck} of {target} returned no result "
                f"{now - first_at:.0f}s after worker {first} returned its "
                f"own, {first_at - start:.0f}s into the run; killed. Last "
                f"log lines of worker {stuck[0]}:\n"
                f"{_tail(folder / f'worker-{stuck[0]}.log')}"
            )
        if pending and now > deadline:
            raise WorkerError(
                f"workers {sorted(pending)} of {target} still running "
                f"after {timeout:.0f}s; killed. Last log lines of "
                f"worker {min(pending)}:\n"
                f"{_tail(folder / f'worker-{min(pending)}.log')}"
            )


def kill_at_signal(
    target: str, timeout: float = 300, env: dict | None = None
) -> int:
    """Runs ``target`` in one worker and kills it when it signals.

    For crash drills ("kill the training process mid-epoch"): the worker
    calls ``signal_and_wait()`` at the point where it must die; this
    function then kills the worker's whole process group with SIGKILL, as
    a preempted machine would, and returns once it is gone. The worker's
    signal travels through a FIFO, so nothing here sleeps or polls a file.

    Args:
        target: ``"module:function"``, called as ``fn(0, 1)``.
        timeout: seconds to wait for the signal.
        env: extra environment variables for the worker.

    Returns:
        The worker's exit status (``-9``).

    Raises:
        WorkerError: the worker exited before signalling (named with its
            status and log tail) or did not signal within ``timeout``.
    """
    with tempfile.TemporaryDirectory(prefix="drill.") as tmp:
        tmp = Path(tmp)
        fifo = tmp / "signal"
        os.mkfifo(fifo)
        # Non-blocking open: the read end exists before the worker starts.
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        wenv = dict(
            env or {},
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            WORKER_SIGNAL=str(fifo),
        )
        log_path = tmp / "worker-0.log"
        proc = _start_worker(target, 0, tmp, wenv)
        try:
            deadline = time.monotonic() + timeout
            while True:
                ready, _, _ = select.select([fd], [], [], 0.2)
                if ready and os.read(fd, 64):
                    break
                if proc.poll() is not None:
                    raise WorkerError(
                        f"worker of {target} exited with status "
                        f"{proc.returncode} before its kill signal:\n"
                        f"{_tail(log_path)}"
                    )
                if time.monotonic() > deadline:
                    raise WorkerError(
                        f"worker of {target} sent no kill signal within "
                        f"{timeout:.0f}s; killed:\n{_tail(log_path)}"
                    )
        finally:
            os.close(fd)
            kill_groups([proc])
        return proc.returncode


def signal_and_wait() -> None:
    """In a ``kill_at_signal`` worker: tell the parent to kill us, and wait.

    Never returns: the parent SIGKILLs this process group.
    """
    with open(os.environ["WORKER_SIGNAL"], "w") as fifo:
        fifo.write("kill me\n")
    threading.Event().wait()


@contextlib.contextmanager
def torch_process_group(rank: int, world_size: int, timeout: float = 60):
    """In a ``run_workers`` worker: a torch.distributed process group, gloo
    on CPU, NCCL over the worker's one GPU (``collective_backend``).

    Rendezvous at ``MASTER_ADDR:MASTER_PORT`` (127.0.0.1, set by
    ``run_workers``); every collective is bounded by ``timeout`` seconds;
    the group is destroyed on exit, also after an error.
    """
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        collective_backend(),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def tf_config(rank: int) -> str:
    """``TF_CONFIG`` JSON for worker ``rank`` of a ``run_workers`` job.

    A ``tf.distribute.MultiWorkerMirroredStrategy`` cluster of
    ``WORLD_SIZE`` workers on 127.0.0.1, one port each (``WORKER_PORTS``).
    Set it as ``os.environ["TF_CONFIG"]`` before the strategy is created.
    Source: https://www.tensorflow.org/guide/distributed_training#TF_CONFIG
    """
    ports = os.environ["WORKER_PORTS"].split(",")
    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": rank},
        }
    )


def _main(target: str) -> None:
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result = fn(rank, world)
    Path(os.environ["WORKER_RESULT"]).write_text(json.dumps(result))


if __name__ == "__main__":
    _run(sys.argv[1])
