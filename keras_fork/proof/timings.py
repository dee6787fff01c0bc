"""``python -m keras_fork timings``: where the time of a test run goes.

Reads what a ``scripts/test`` run leaves in ``dist/``:

* ``test-stages.tsv``: one line a stage, ``<name> <start> <end>`` (tab
  separated, seconds since the epoch, bash's ``EPOCHREALTIME``), written by
  ``scripts/test``;
* ``proof.json``: its ``runs``, each pytest process of the matrix with
  its wall time (``seconds``) and JUnit file, whose ``testcase`` times are
  the tests' own compute.

and writes ``dist/timings.json`` (atomically) and prints the breakdown:

* each stage's wall time;
* of the proof matrix: the sum of its runs' wall time, split into the
  tests' own time (JUnit) and each process's overhead (interpreter start,
  framework imports, collection, fixtures outside tests: wall minus
  JUnit), single-process and multi-process runs apart (a multi-process
  run's tests include starting the workers and their rendezvous);
* the slot time left idle: ``jobs`` slots over the ``prove`` stage's wall
  time, less what the runs held (a multi-process run holds every slot);
* the longest runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from integration_tests.harness.junit import read_junit
from keras_fork.errors import ForkError
from keras_fork.outputs import print_table
from keras_fork.outputs import write_atomic
from keras_fork.recipe import pins

STAGES_FILE = "test-stages.tsv"
PROVE_STAGE = "proof matrix"


@dataclasses.dataclass(frozen=True)
class Run:
    """One pytest process of the matrix.

    Attributes:
        label: the run's name and its number of cells.
        seconds: its wall time, process start to exit.
        tests: the sum of its JUnit ``testcase`` times (0 when unreadable).
        multi_process: whether its topology's replicas are worker processes.
    """

    label: str
    seconds: float
    tests: float
    multi_process: bool

    @property
    def overhead(self) -> float:
        """Wall time outside the tests (never below 0)."""
        return max(0.0, self.seconds - self.tests)


def read_stages(path: Path) -> list[dict]:
    """``[{"name", "seconds"}]`` of ``test-stages.tsv``, in order.

    Raises:
        ForkError: the file is missing or a line is not ``name start end``.
    """
    if not path.is_file():
        raise ForkError(f"{path} not found: run scripts/test first")
    stages = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        parts = line.split("\t")
        try:
            name, start, end = parts
            seconds = float(end) - float(start)
        except ValueError:
            raise ForkError(
                f"{path}:{n}: expected 'name<TAB>start<TAB>end', got {line!r}"
            ) from None
        stages.append({"name": name, "seconds": round(seconds, 1)})
    return stages


def junit_seconds(path: Path) -> float:
    """The sum of the ``time`` of every ``testcase`` of a JUnit file (0.0
    when it is missing or unreadable)."""
    return sum(c["time"] for c in read_junit(path).cases)


def read_runs(proof_json: Path, root: Path) -> list[Run]:
    """Every pytest process of the last prove, from ``proof.json``'s
    ``runs`` (one per group run, reruns of single cells included).

    Raises:
        ForkError: the file is missing or not a proof document.
    """
    try:
        runs = json.loads(proof_json.read_text())["runs"]
    except (FileNotFoundError, KeyError, ValueError):
        raise ForkError(f"{proof_json}: no proof run to read") from None
    return [
        Run(
            f"{r['run']} ({r['cells']} cells)",
            r["seconds"],
            junit_seconds(root / r["junit"]),
            r["multi_process"],
        )
        for r in runs
    ]


def summarize(stages: list[dict], runs: list[Run], jobs: int) -> dict:
    """The breakdown of the module doc, as one JSON-able dict (seconds)."""
    single = [r for r in runs if not r.multi_process]
    multi = [r for r in runs if r.multi_process]
    prove = next((s["seconds"] for s in stages if s["name"] == PROVE_STAGE), 0)
    held = sum(r.seconds for r in single) + jobs * sum(r.seconds for r in multi)
    return {
        "stages": stages,
        "total": round(sum(s["seconds"] for s in stages), 1),
        "matrix": {
            "runs": len(runs),
            "jobs": jobs,
            "wall": prove,
            "single_process": _split(single),
            "multi_process": _split(multi),
            "idle_slot_seconds": round(max(0.0, jobs * prove - held), 1),
        },
        "longest_runs": [
            dataclasses.asdict(r)
            for r in sorted(runs, key=lambda r: -r.seconds)[:10]
        ],
    }


def _split(runs: list[Run]) -> dict:
    return {
        "runs": len(runs),
        "seconds": round(sum(r.seconds for r in runs), 1),
        "tests": round(sum(r.tests for r in runs), 1),
        "overhead": round(sum(r.overhead for r in runs), 1),
    }


def add_arguments(p) -> None:
    """The ``timings`` verb's options."""
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="slots the matrix ran with (default: prove's default here)",
    )


def main(args, layout: pins.Layout) -> int:
    """Reads ``dist/``'s records of the last test run, writes
    ``dist/timings.json`` and prints the breakdown.

    Raises:
        ForkError: no stage record or no proof run in ``dist/``.
    """
    from integration_tests.harness import schedule

    jobs = args.jobs or schedule.default_jobs("cpu")
    stages = read_stages(layout.dist / STAGES_FILE)
    runs = read_runs(layout.proof, layout.root)
    summary = summarize(stages, runs, jobs)
    text = json.dumps(summary, indent=2) + "\n"
    write_atomic(layout.dist / "timings.json", text)
    _print(summary)
    return 0


def _print(summary: dict) -> None:
    lines = [
        (f"stage: {s['name']}", f"{s['seconds']:.0f}")
        for s in summary["stages"]
    ]
    m = summary["matrix"]
    for kind in ("single_process", "multi_process"):
        part = m[kind]
        name = kind.replace("_", "-")
        lines.append(
            (
                f"matrix, {part['runs']} {name} runs: tests",
                f"{part['tests']:.0f}",
            )
        )
        lines.append(
            (
                f"matrix, {name} runs: start-up, imports, collection",
                f"{part['overhead']:.0f}",
            )
        )
    lines.append(
        (
            f"matrix: idle slot time ({m['jobs']} slots)",
            f"{m['idle_slot_seconds']:.0f}",
        )
    )
    print_table(
        f"where the time goes ({summary['total']:.0f} s in all)",
        ("part", ("seconds", "right")),
        lines,
    )
    for r in summary["longest_runs"]:
        print(f"  {r['seconds']:7.1f} s  {r['label']}")
