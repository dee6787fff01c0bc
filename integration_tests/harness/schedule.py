"""How a matrix of runs uses this machine: on which accelerator, how many
runs at a time, and which run starts next.

The one scheduling core of ``verify`` (any installed keras) and of
``keras_fork``'s ``prove`` and ``bench`` (stock against fork): each plans
its own runs, then resolves ``--accelerator`` with ``accelerator``, sizes
its slots with ``default_jobs`` and runs its queue with ``run_all``. A run
is any object with a ``multi_process`` attribute (``Run`` of ``verify``,
``Group`` of the proof matrix).
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait

from . import options
from . import run


def accelerator(choice: str) -> tuple[str, int]:
    """``--accelerator`` on this machine.

    Args:
        choice: ``auto`` (``gpu`` where this process may use a GPU, else
            ``cpu``), ``cpu`` or ``gpu``.

    Returns:
        ``(accelerator, gpus)``: ``cpu`` or ``gpu``, and how many GPUs this
        process may use (``run.visible_gpus``).

    Raises:
        ValueError: ``gpu`` where this process may use no GPU, or a choice
            not in ``options.ACCELERATORS``.
    """
    if choice not in options.ACCELERATORS:
        raise ValueError(
            f"--accelerator {choice}: not one of "
            f"{', '.join(options.ACCELERATORS)}"
        )
    gpus = len(run.visible_gpus())
    if choice == "auto":
        return ("gpu" if gpus else "cpu"), gpus
    if choice == "gpu" and not gpus:
        raise ValueError("--accelerator gpu: this machine shows no GPU")
    return choice, gpus


def default_jobs(accelerator: str) -> int:
    """Runs at the same time: 1 on GPUs (each run uses every GPU: two would
    compete for their memory), else 2 where there are 2 or more cores (one
    pytest process mostly keeps one core busy)."""
    if accelerator == "gpu":
        return 1
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def runs_to_start(queue, running, jobs: int) -> list:
    """The runs of ``queue`` to start now, in its order, on ``jobs`` slots.

    A single-process run holds one slot; a multi-process run holds every
    slot, its workers needing every core (on the CPU, sharing the cores
    with a single-process run slowed both by about half: docs/test-run.md)
    or every GPU.

    Args:
        queue: the runs waiting, first to start first.
        running: the runs running now.
        jobs: the slots.

    Returns:
        The runs to start. A run that needs more slots than are free holds
        back the runs queued after it (the running ones drain, then it
        starts), so that a multi-process run is not starved.
    """

    def size(r) -> int:
        return jobs if r.multi_process else 1

    used = sum(size(r) for r in running)
    start = []
    for r in queue:
        if used + size(r) > jobs:
            break
        start.append(r)
        used += size(r)
    return start


def run_all(queue, start, jobs: int, finished) -> None:
    """Runs every run of ``queue`` on ``jobs`` slots (``runs_to_start``).

    Args:
        queue: the runs, in the order they start.
        start: ``start(r)`` runs ``r`` (in a worker thread) and returns its
            result.
        jobs: the slots.
        finished: ``finished(r, result)``, called in this thread as each
            run ends; the runs it returns (a list, or None) start next,
            before the rest of the queue.

    Raises:
        Whatever ``start`` or ``finished`` raises; then no other run
        starts, and the runs already started are waited for.
    """
    queue, running = list(queue), {}
    with ThreadPoolExecutor(jobs) as pool:
        while queue or running:
            for r in runs_to_start(queue, running.values(), jobs):
                queue.remove(r)
                running[pool.submit(start, r)] = r
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                r = running.pop(future)
                queue[:0] = finished(r, future.result()) or []
