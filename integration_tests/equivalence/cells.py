"""One cell of the equivalence table: a feature under a topology against
one device, and its verdict.

``run_cell`` runs the feature (``features.FEATURES``) under the topology
of this process (``harness.devices.current``) and on one device, on the
same global batches, and compares every result by name. On a
multi-process topology the test process is the one device; the feature
runs in the worker processes (``harness.workers.run_workers``), each
compared with it.

Verdicts: ``equal`` (every result within the feature's tolerances),
``differs`` (the worst result and by how much), ``error`` (the run under
the topology raised, or a worker failed or ran past its bound: the
message names it), ``n/a`` (why the feature does not apply there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from ..harness import devices
from ..harness import workers
from . import features

VERDICTS = ("equal", "differs", "error", "n/a")
# The variables a worker reads: the feature, the topology, the folder the
# processes share.
FEATURE_ENV = "EQUIVALENCE_FEATURE"
TOPOLOGY_ENV = "EQUIVALENCE_TOPOLOGY"
FOLDER_ENV = "EQUIVALENCE_FOLDER"
# Where each test writes its cell's record (``record``); unset: nowhere.
OUT_ENV = "EQUIVALENCE_OUT"
# Seconds the workers of one multi-process cell may take together: each
# feature needs 10 to 40 s in 2 processes on 2 CPU cores.
WORKER_TIMEOUT = 240

NOT_FIT = (
    "torch/ddp-2 trains in a custom loop (Keras's DDP guide); fit() over "
    "torch processes is torch/dp-2"
)


@dataclasses.dataclass
class Cell:
    """A cell's verdict.

    Attributes:
        feature, backend, topology: what ran.
        verdict: one of ``VERDICTS``.
        detail: for ``differs`` the worst result (``"<process>: <name>:
            max |diff| <a> (max rel <r>)"``), for ``error`` the message,
            for ``n/a`` why; empty for ``equal``.
        seconds: wall time of the cell.
    """

    feature: str
    backend: str
    topology: str
    verdict: str
    detail: str = ""
    seconds: float = 0.0


def _as_arrays(results: dict) -> dict:
    return {k: np.asarray(v) for k, v in results.items()}


def compare(actual: dict, expected: dict, feature, where="") -> str | None:
    """How ``actual`` differs from ``expected`` (dicts of arrays), or None
    where every name of ``actual`` is within the feature's tolerances.

    A name ``expected`` has and ``actual`` lacks differs, except
    ``predict`` (not asked of a process that feeds a part of the data) and
    ``file/*`` in a process that does not read files back.
    """
    actual, expected = _as_arrays(actual), _as_arrays(expected)
    extra = sorted(set(actual) - set(expected))
    if extra:
        return f"{where}results one device does not have: {extra}"
    worst = None
    for name, want in expected.items():
        if name not in actual:
            continue
        got = actual[name]
        if got.shape != want.shape:
            return f"{where}{name}: shape {got.shape}, one device {want.shape}"
        if np.allclose(
            got, want, rtol=feature.rtol, atol=feature.atol, equal_nan=True
        ):
            continue
        diff = np.abs(got.astype("float64") - want.astype("float64"))
        diff = np.nan_to_num(diff, nan=np.inf)
        scale = np.maximum(np.abs(want.astype("float64")), 1e-12)
        rel = float(np.max(diff / scale))
        if worst is None or rel > worst[1]:
            worst = (name, rel, float(np.max(diff)), got, want)
    if worst is None:
        return None
    name, rel, absolute, got, want = worst
    text = f"{where}{name}: max |diff| {absolute:.3g} (max rel {rel:.3g})"
    if got.size <= 4:
        text += f": {np.ravel(got).tolist()} vs {np.ravel(want).tolist()}"
    return text


def _one_device(feature, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    return feature.run(features.Feed(contextlib.nullcontext, folder))


def run_cell(name: str, topology, folder: Path) -> Cell:
    """Runs feature ``name`` under ``topology`` (a ``devices.Topology``)
    and on one device; its ``Cell``.

    Raises:
        KeyError: an unknown feature.
    """
    import time

    feature = features.FEATURES[name]
    start = time.monotonic()
    cell = Cell(name, topology.backend, topology.name, "equal")
    why = feature.not_applicable(topology.backend, topology.name)
    if why is None and topology.one_device:
        why = "the one-device reference itself"
    if (
        why is None
        and feature.multi_process_only
        and not (topology.multi_process)
    ):
        why = "compares the processes of a multi-process job"
    if why is None and (topology.backend, topology.name) == ("torch", "ddp-2"):
        why = NOT_FIT
    if why:
        cell.verdict, cell.detail = "n/a", why
        return cell
    try:
        if topology.multi_process:
            found = _multi_process(feature, topology, folder)
        else:
            found = _in_process(feature, topology, folder)
    except features.NotApplicable as e:
        found = ("n/a", str(e))
    except Exception as e:  # noqa: BLE001 (the verdict of the cell)
        found = ("error", f"{type(e).__name__}: {e}".strip()[:600])
    cell.verdict, cell.detail = found
    cell.seconds = round(time.monotonic() - start, 1)
    return cell


def _in_process(feature, topology, folder: Path):
    expected = _one_device(feature, folder / "one-device")
    distributed = folder / "distributed"
    distributed.mkdir()
    try:
        actual = feature.run(features.Feed(topology.scope, distributed))
    except features.NotApplicable as e:
        return "n/a", str(e)
    except Exception as e:  # noqa: BLE001
        return "error", f"{type(e).__name__}: {e}".strip()[:600]
    differs = compare(actual, expected, feature)
    return ("differs", differs) if differs else ("equal", "")


def _multi_process(feature, topology, folder: Path):
    if feature.multi_process_only:
        expected = None
    else:
        expected = _one_device(feature, folder / "one-device")
    shared = folder / "shared"
    shared.mkdir()
    env = {
        FEATURE_ENV: feature.name,
        TOPOLOGY_ENV: topology.name,
        FOLDER_ENV: str(shared),
    }
    try:
        runs = workers.run_workers(
            f"{__name__}:worker", world_size=2, timeout=WORKER_TIMEOUT, env=env
        )
    except workers.WorkerError as e:
        return "error", str(e).strip()[:600]
    for rank, run in enumerate(runs):
        if "not_applicable" in run:
            return "n/a", run["not_applicable"]
        if "error" in run:
            return "error", f"process {rank}: {run['error']}"[:600]
    results = [run["results"] for run in runs]
    if expected is None:
        expected = results[0]
    for rank, result in enumerate(results):
        differs = compare(result, expected, feature, f"process {rank}: ")
        if differs:
            return "differs", differs
    return "equal", ""


def worker(rank: int, world_size: int) -> dict:
    """In a worker of a multi-process cell: joins the job of the topology
    ``EQUIVALENCE_TOPOLOGY`` and runs the feature ``EQUIVALENCE_FEATURE``
    with the shared folder ``EQUIVALENCE_FOLDER``.

    Returns:
        ``{"results": {name: list}}``, or ``{"error": "<type>: <message>"}``
        where the feature raised in this process.
    """
    name = os.environ[FEATURE_ENV]
    topology = os.environ[TOPOLOGY_ENV]
    folder = Path(os.environ[FOLDER_ENV])
    feature = features.FEATURES[name]
    stack = contextlib.ExitStack()
    if topology == "multiworker-2":
        strategy = devices.multi_worker_strategy(rank)
        feed = features.Feed(strategy.scope, folder, rank, world_size)
    elif topology == "procs-2":
        distribution = devices.jax_processes(rank, world_size)
        feed = features.Feed(
            distribution.scope, folder, rank, world_size, local=True
        )
    elif topology == "dp-2":
        stack.enter_context(
            workers.torch_process_group(rank, world_size, timeout=60)
        )
        distribution = devices.torch_processes(rank, world_size)
        # Auto-sharding takes a PyDataset or tf.data only; the features
        # feed arrays: each process its part of every global batch.
        distribution.auto_shard_dataset = False
        feed = features.Feed(
            distribution.scope, folder, rank, world_size, local=True
        )
    else:
        raise ValueError(f"no multi-process set-up for topology {topology}")
    with stack:
        try:
            results = feature.run(feed)
        except features.NotApplicable as e:
            return {"not_applicable": str(e)}
        except Exception as e:  # noqa: BLE001 (reported to the test process)
            return {"error": f"{type(e).__name__}: {e}".strip()}
    return {"results": {k: np.asarray(v).tolist() for k, v in results.items()}}


def record(cell: Cell) -> None:
    """Writes ``cell`` as JSON into ``EQUIVALENCE_OUT`` (atomically, one
    file a cell), where that variable is set."""
    out = os.environ.get(OUT_ENV)
    if not out:
        return
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    slug = cell.feature.replace("/", "--")
    target = out / f"{cell.backend}--{cell.topology}--{slug}.json"
    fd, tmp = tempfile.mkstemp(dir=out, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(dataclasses.asdict(cell), f)
    os.replace(tmp, target)
