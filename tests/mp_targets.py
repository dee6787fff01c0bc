"""Worker functions for tests/test_multiprocess.py (run in child processes)."""

import os
import threading


def echo(rank, world_size):
    return {"rank": rank, "world": world_size, "pid": os.getpid()}


def parent(rank, world_size):
    return os.getppid()


def environ(rank, world_size):
    """The worker's environment and session, as the worker sees them."""
    return {"env": dict(os.environ), "sid": os.getsid(0), "pid": os.getpid()}


def crash_on_rank_1(rank, world_size):
    if rank == 1:
        raise RuntimeError("rank 1 broke on purpose")
    threading.Event().wait()  # rank 0 would wait forever: must be killed


def hang(rank, world_size):
    with open(os.environ["PID_DIR"] + f"/{rank}", "w") as f:
        f.write(str(os.getpid()))
    threading.Event().wait()


def tf_config(rank, world_size):
    from integration_tests.harness import workers

    return workers.tf_config(rank)


def signal_mid_work(rank, world_size):
    from integration_tests.harness import workers

    with open(os.environ["PID_DIR"] + "/victim", "w") as f:
        f.write(str(os.getpid()))
    workers.signal_and_wait()


def exit_early(rank, world_size):
    raise SystemExit(3)


def register_atexit(rank, world_size):
    """Leaves a file behind from an atexit handler, as JAX's shutdown is."""
    import atexit

    path = os.environ["PID_DIR"] + f"/atexit-{rank}"
    atexit.register(lambda: open(path, "w").close())
    return os.getppid()


def fail_behind_a_blocking_atexit(rank, world_size):
    """Registers an atexit handler that waits forever (as JAX's shutdown
    barrier does for a peer stuck in a collective), then rank 1 fails;
    rank 0 waits forever."""
    import atexit

    atexit.register(threading.Event().wait)
    if rank == 1:
        raise AssertionError("rank 1 checked its result and failed")
    threading.Event().wait()


def return_on_rank_0_hang_rank_1(rank, world_size):
    """Rank 0 returns at once; rank 1 never does (as a worker stuck in a
    collective its peer left)."""
    if rank == 1:
        with open(os.environ["PID_DIR"] + "/1", "w") as f:
            f.write(str(os.getpid()))
        threading.Event().wait()
    return rank
