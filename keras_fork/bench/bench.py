"""Benchmarks: fork vs stock, measured in the same run (never a timed test).

Each round of a case starts two ``keras_fork.bench.worker`` processes, stock
and fork, and, once both are warm, has them take turns (lockstep, see
``LiveWorker``): one repetition (an epoch, a batch of calls) of one, then of
the other, in strict alternation (``measure_round``), so that the two are
never measured at the same time and the machine's drift hits both alike.
Each fork turn against the stock turns around it gives a fork/stock ratio;
a case reports the medians, the median of its ratios with a bootstrap
confidence interval (``median_ci``), and the spread of the rounds (fresh
processes: their memory layout differs). Single-device cases on CPU
run pinned to one core, where a 2-core machine's scheduling noise is
smallest. Results: ``dist/bench.json`` and a table (``--docs`` puts it in
docs/benchmarks.md). A run of some cases (``--case``, ``--backend``,
``--topology``) replaces those rows of the last run on the same machine
with as many rounds (``merge``) and keeps the others.

``--work`` counts instead of timing (``run_work``): the Python calls per
step and the compiled training step of each step case, stock and fork, into
``dist/bench-work.json``; counts resolve what the timings' noise cannot.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from packaging.version import Version

from integration_tests.harness import topologies
from integration_tests.harness import workers
from keras_fork.errors import ForkError
from keras_fork.errors import check_known
from keras_fork.outputs import replace_between
from keras_fork.outputs import write_atomic
from keras_fork.proof import variants
from keras_fork.recipe import pins
from keras_fork.recipe import submission

# How a run's timings were taken (``dist/bench.json``'s ``method``): rows of
# runs taken otherwise do not merge with a new run's.
METHOD = "lockstep"
DOCS_BEGIN = "<!-- bench-table:begin -->"
DOCS_END = "<!-- bench-table:end -->"
# The committed tables, in ``layout.docs`` (``--docs``).
DOCS_FILE = "benchmarks.md"

# (case, workload, backend, topology, options). ``epochs`` (``repeats``) is
# the turns each variant takes per round: more where a turn is short, so
# that a round measures each variant for a few seconds at least.
# A table, one case a row (two lines), kept so by the marker at its end:
# ruff format would spread each row over 7 to 12 lines.
CASES = [
    ("shuffle epoch, 10M samples", "shuffle", "jax", "1",
     {"samples": 10_000_000, "batch_size": 1024, "epochs": 5,
      "path": "numpy"}),
    ("shuffle epoch, 10M samples", "shuffle", "tensorflow", "1",
     {"samples": 10_000_000, "batch_size": 1024, "epochs": 5,
      "path": "tf"}),
    ("shuffle epoch, 10M samples", "shuffle", "torch", "1",
     {"samples": 10_000_000, "batch_size": 1024, "epochs": 5,
      "path": "torch"}),
    ("stateless_call, small MLP", "stateless_call", "jax", "1",
     {"calls": 200, "repeats": 20}),
    ("stateless_call, small MLP", "stateless_call", "tensorflow", "1",
     {"calls": 200, "repeats": 20}),
    ("stateless_call, small MLP", "stateless_call", "torch", "1",
     {"calls": 200, "repeats": 20}),
    ("fit step, small MLP", "fit_step", "jax", "1",
     {"samples": 4096, "batch_size": 64, "epochs": 100}),
    ("fit step, small MLP", "fit_step", "jax", "8",
     {"samples": 4096, "batch_size": 64, "epochs": 20}),
    ("fit step, small MLP", "fit_step", "tensorflow", "1",
     {"samples": 4096, "batch_size": 64, "epochs": 60}),
    ("fit step, small MLP", "fit_step", "tensorflow", "mirrored-2",
     {"samples": 4096, "batch_size": 64, "epochs": 12}),
    ("fit step, small MLP", "fit_step", "torch", "1",
     {"samples": 4096, "batch_size": 64, "epochs": 60}),
    ("DDP loop step, small MLP", "ddp_step", "torch", "ddp-2",
     {"samples": 4096, "batch_size": 64, "epochs": 12, "processes": 2}),
    ("fit step, CNN + BatchNorm", "fit_step", "jax", "1",
     {"samples": 8192, "batch_size": 64, "epochs": 10, "model": "cnn"}),
    ("fit step, CNN + BatchNorm", "fit_step", "torch", "1",
     {"samples": 8192, "batch_size": 64, "epochs": 10, "model": "cnn"}),
    ("DDP loop step, CNN + BatchNorm", "ddp_step", "torch", "ddp-2",
     {"samples": 4096, "batch_size": 64, "epochs": 8, "processes": 2,
      "model": "cnn"}),
    ("fit step, CNN + BatchNorm", "fit_step", "tensorflow", "1",
     {"samples": 8192, "batch_size": 64, "epochs": 10, "model": "cnn"}),
    ("fit step, CNN + BatchNorm", "fit_step", "tensorflow", "mirrored-2",
     {"samples": 8192, "batch_size": 64, "epochs": 8, "model": "cnn"}),
    ("fit step, MLP + accuracy/AUC", "fit_step", "tensorflow", "1",
     {"samples": 4096, "batch_size": 64, "epochs": 30, "metrics": True}),
    ("fit step, MLP + accuracy/AUC", "fit_step", "tensorflow", "mirrored-2",
     {"samples": 4096, "batch_size": 64, "epochs": 12, "metrics": True}),
    # 8 virtual devices on 2 cores: a longer conv run can starve one
    # device thread past XLA's 40 s collective rendezvous timeout.
    ("fit step, CNN + BatchNorm", "fit_step", "jax", "8",
     {"samples": 2048, "batch_size": 64, "epochs": 12, "model": "cnn"}),
    # Keras fit() over torch processes: on master only ("since").
    ("fit step, MLP + accuracy/AUC", "dp_fit_step", "torch", "dp-2",
     {"samples": 4096, "batch_size": 64, "epochs": 4, "metrics": True,
      "processes": 2, "since": "3.16.0.dev0"}),
    ("fit step, CNN + BatchNorm", "dp_fit_step", "torch", "dp-2",
     {"samples": 2048, "batch_size": 64, "epochs": 4, "model": "cnn",
      "processes": 2, "since": "3.16.0.dev0"}),
    # The same batches with no known length: the processes compare them
    # before each step (torch-unknown-steps).
    ("fit step, MLP + accuracy/AUC, unknown length", "dp_fit_step", "torch",
     "dp-2", {"samples": 4096, "batch_size": 64, "epochs": 4,
              "metrics": True, "processes": 2, "since": "3.16.0.dev0",
              "input": "iterable"}),
    # JAX fit() over processes, the same batches of known and of unknown
    # length (jax-unknown-steps compares them before each step).
    ("fit step, MLP + accuracy/AUC", "jax_procs_fit_step", "jax", "procs-2",
     {"samples": 4096, "batch_size": 64, "epochs": 4, "metrics": True,
      "processes": 2}),
    ("fit step, MLP + accuracy/AUC, unknown length", "jax_procs_fit_step",
     "jax", "procs-2", {"samples": 4096, "batch_size": 64, "epochs": 4,
                        "metrics": True, "processes": 2,
                        "input": "tf.data-filter"}),
]  # fmt: skip


def _run_worker(
    variant_dir, overlay, workload, backend, topology, opts, accelerator
):
    """Runs ``keras_fork.bench.worker`` once; returns its JSON document."""
    env = variants.child_env(
        variant_dir, overlay, topologies.env_for(backend, topology, accelerator)
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_fork.bench.worker",
            workload,
            json.dumps(opts),
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=pins.REPO_ROOT,
        timeout=900,
    )
    if proc.returncode != 0:
        raise ForkError(
            f"benchmark {workload} ({backend}/{topology}) failed:\n"
            f"{proc.stderr[-2000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


class LiveWorker:
    """A benchmark worker that measures when told to (lockstep).

    The benchmark's side of ``worker.Gate``: this listens on a free
    port of 127.0.0.1, starts the worker in its own session with
    ``BENCH_GATE`` pointing there, and ``turn`` runs one repetition. Every
    wait is bounded (``timeout`` seconds) and fails early when the worker
    exits; ``close`` ends the round and collects the worker's result;
    ``kill`` ends its whole process group (a worker may start others).

    Raises:
        ForkError: the worker exited, broke the protocol or did not answer
            in time; the message names the worker and has its log's tail.
    """

    def __init__(self, name, cmd, env, cpu=None, timeout=900):
        self.name = name
        self.timeout = timeout
        self._server = socket.create_server(("127.0.0.1", 0))
        port = self._server.getsockname()[1]
        env = dict(env, BENCH_GATE=f"127.0.0.1:{port}")
        if cpu is not None:
            env["BENCH_CPU"] = str(cpu)
        self._out = tempfile.TemporaryFile("w+")
        self._err = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=self._out,
            stderr=self._err,
            cwd=pins.REPO_ROOT,
            start_new_session=True,
        )
        self._conn = None
        self._buffer = b""

    def _failure(self, what):
        self._err.seek(0)
        tail = self._err.read()[-2000:]
        return ForkError(f"benchmark worker {self.name} {what}:\n{tail}")

    def _wait_readable(self, sock):
        deadline = time.monotonic() + self.timeout
        while not select.select([sock], [], [], 1.0)[0]:
            code = self.proc.poll()
            if code is not None:
                raise self._failure(f"exited with status {code}")
            if time.monotonic() > deadline:
                raise self._failure(f"did not answer in {self.timeout} s")

    def _receive(self):
        while b"\n" not in self._buffer:
            self._wait_readable(self._conn)
            data = self._conn.recv(4096)
            if not data:  # the worker is exiting, or broke the protocol
                try:
                    code = self.proc.wait(timeout=min(self.timeout, 60))
                except subprocess.TimeoutExpired:
                    raise self._failure("closed the gate") from None
                raise self._failure(f"exited with status {code}")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise self._failure(f"sent {line[:200]!r}") from None

    def ready(self):
        """Waits until the worker, warmed up, waits for its first turn."""
        self._wait_readable(self._server)
        self._conn, _ = self._server.accept()
        if self._receive() != {"ready": True}:
            raise self._failure("did not say it was ready")

    def turn(self):
        """Runs one repetition; returns its duration (seconds)."""
        self._conn.sendall(b"go\n")
        message = self._receive()
        if not isinstance(message.get("seconds"), float):
            raise self._failure(f"sent {message!r}, not a duration")
        return message["seconds"]

    def close(self):
        """Ends the round: the worker exits; returns its result document
        (``peak_mib``)."""
        self._conn.close()
        try:
            code = self.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise self._failure(f"did not exit in {self.timeout} s") from None
        if code != 0:
            raise self._failure(f"exited with status {code}")
        self._out.seek(0)
        return json.loads(self._out.read().strip().splitlines()[-1])

    def kill(self):
        """Kills the worker's process group and frees the port."""
        workers.kill_groups([self.proc])
        for closeable in (self._conn, self._server, self._out, self._err):
            if closeable is not None:
                closeable.close()


def _turns_key(opts) -> str:
    """The option that counts a case's repetitions (turns in a round)."""
    return "epochs" if "epochs" in opts else "repeats"


def _with_settling_turn(opts):
    """``opts`` with one more turn, which ``measure_round`` discards: the
    first turn after both warm-ups still overlaps their tail (a worker's
    background threads, its collector)."""
    return dict(opts, **{_turns_key(opts): opts[_turns_key(opts)] + 1})


def round_order(round_index):
    """The variants in the order they start and take turns: odd rounds
    start with the fork. The worker started first also goes first (an A/A
    run showed the slot started second faster by a few percent on torch),
    so that neither variant keeps either place."""
    return ("stock", "fork") if round_index % 2 == 0 else ("fork", "stock")


def measure_round(round_index, workers, turns):
    """One round: both workers warm up, then take turns.

    The turns alternate strictly (ABAB: a back-to-back turn would find
    the worker's own background work from its last turn, e.g. tf.data's
    prefetch for the next epoch, still running, and a turn after the other
    variant's does not), in ``round_order``. The first turn of each
    variant settles (discarded).

    Args:
        round_index: the round's number.
        workers: ``{"stock": LiveWorker, "fork": LiveWorker}``, started,
            each to take ``turns`` turns.
        turns: the turns each worker takes, the settling one included; at
            least 3.

    Returns:
        ``(times, ratios, peaks)``: ``{variant: [seconds, ...]}``, the
        durations of the measured turns; the fork/stock ratio of each
        measured fork turn to the mean of the stock turns just before and
        just after it (so that the order within a pair weighs on neither);
        ``{variant: peak MiB}``.

    Raises:
        ValueError: fewer than 3 turns (no fork turn between two measured
            stock turns).
    """
    if turns < 3:
        raise ValueError(f"a round needs at least 3 turns, not {turns}")
    order = round_order(round_index)
    for variant in order:
        workers[variant].ready()
    sequence = []
    for _ in range(turns):
        for variant in order:
            sequence.append((variant, workers[variant].turn()))
    sequence = sequence[2:]  # the settling turns
    times = {v: [t for w, t in sequence if w == v] for v in order}
    ratios = [
        t / ((sequence[i - 1][1] + sequence[i + 1][1]) / 2)
        for i, (variant, t) in enumerate(sequence)
        if variant == "fork" and 0 < i < len(sequence) - 1
    ]
    peaks = {v: w.close()["peak_mib"] for v, w in workers.items()}
    return times, ratios, peaks


def pinned_cpu(topology, accelerator):
    """The CPU that both workers of a single-device CPU case run on (the
    last this process may use), or ``None``: multi-device topologies use
    every core, GPU cases are not pinned."""
    if topology != "1" or accelerator != "cpu":
        return None
    return max(os.sched_getaffinity(0))


def median_ci(round_ratios, confidence=0.95, resamples=2000):
    """A cluster-bootstrap confidence interval of the median ratio.

    The ratios of one round share a pair of processes, whose memory layout
    and thread placement stay for the whole round, so they are not
    independent of each other: each resample draws rounds with
    replacement, then ratios with replacement within each drawn round,
    and takes the median of the pooled draw (the two-stage bootstrap of
    Davison and Hinkley, Bootstrap Methods and their Application, 1997,
    section 3.8). The interval is the resamples' percentiles; a fixed seed
    makes it reproducible.

    Args:
        round_ratios: one list of fork/stock ratios per round, none empty.
        confidence: the interval's coverage, in (0, 1).
        resamples: number of bootstrap resamples.

    Returns:
        ``(low, high)``.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    rounds = [np.asarray(r, dtype=float) for r in round_ratios]
    medians = np.empty(resamples)
    for b in range(resamples):
        drawn = rng.integers(len(rounds), size=len(rounds))
        medians[b] = np.median(
            np.concatenate(
                [rng.choice(rounds[i], size=len(rounds[i])) for i in drawn]
            )
        )
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(low), float(high)


def _live_round(round_index, cmd, envs, label, cpu, turns):
    """One round of a case: starts its stock and fork ``LiveWorker``s
    (``envs``: their environments by variant) in ``round_order``, measures
    the round (``measure_round``, whose result this returns) and kills
    both workers, whatever happened."""
    workers = {}
    try:
        for v in round_order(round_index):
            workers[v] = LiveWorker(f"{v} ({label})", cmd, envs[v], cpu)
        return measure_round(round_index, workers, turns)
    finally:
        for w in workers.values():
            w.kill()


def _measure_case(case, rounds, envs, cpu):
    """Runs ``rounds`` rounds of ``case`` (a ``CASES`` entry).

    Returns:
        ``(times, peaks, round_ratios)``: every measured turn's seconds
        and every round's peak MiB, by variant; each round's fork/stock
        ratios.
    """
    _, workload, backend, topology, opts = case
    opts = _with_settling_turn(opts)
    cmd = [
        sys.executable,
        "-m",
        "keras_fork.bench.worker",
        workload,
        json.dumps(opts),
    ]
    label = f"{workload}, {backend}/{topology}"
    times = {"stock": [], "fork": []}
    peaks = {"stock": [], "fork": []}
    round_ratios = []
    for r in range(rounds):
        turns, ratios, peak = _live_round(
            r, cmd, envs, label, cpu, opts[_turns_key(opts)]
        )
        round_ratios.append(ratios)
        for v in times:
            times[v] += turns[v]
            peaks[v].append(peak[v])
    return times, peaks, round_ratios


def _case_row(case, cpu, times, peaks, round_ratios):
    """The ``dist/bench.json`` row of ``case`` from its rounds
    (``_measure_case``); the fields are ``run``'s."""
    name, _, backend, topology, _ = case
    ratios = [q for rr in round_ratios for q in rr]
    per_round = [statistics.median(rr) for rr in round_ratios]
    low, high = median_ci(round_ratios)
    return {
        "case": name,
        "backend": backend,
        "topology": topology,
        "stock_median_s": statistics.median(times["stock"]),
        "fork_median_s": statistics.median(times["fork"]),
        "ratio": statistics.median(ratios),
        "ratio_ci_low": low,
        "ratio_ci_high": high,
        "ratio_min": min(per_round),
        "ratio_max": max(per_round),
        "pairs": len(ratios),
        "stock_peak_mib": max(peaks["stock"]),
        "fork_peak_mib": max(peaks["fork"]),
        "pinned_cpu": cpu,
        "round_ratios": round_ratios,
        "date": datetime.date.today().isoformat(),
    }


def run(layout, base, rounds, accelerator, cases, console, aa=False):
    """Measures every case; returns the ``dist/bench.json`` document.

    With ``aa`` (an A/A run), the "fork" column measures stock again: the
    spread of its ratios is the noise floor of each case on this machine,
    against which a fork/stock ratio can be read.

    Each row: ``stock_median_s``/``fork_median_s`` (seconds per step, per
    call, or per epoch for the shuffle cases: the median of every turn),
    ``ratio`` (the median of the fork turns' ratios to their neighbouring
    stock turns, ``measure_round``),
    ``ratio_ci_low``/``ratio_ci_high`` (its 95% interval, ``median_ci``),
    ``ratio_min``/``ratio_max`` (the smallest and largest of the rounds'
    own medians), ``pairs``, the peaks (MiB, the largest of any round),
    ``pinned_cpu`` and ``round_ratios`` (every ratio, by round: the data
    the statistics come from).

    Raises:
        ForkError: a worker failed (``LiveWorker``); every worker of the
            round is killed first.
    """
    dirs = dict(variants.install_variants(layout, base))
    if aa:
        dirs["fork"] = dirs["stock"]
    label = "stock/stock (A/A)" if aa else "fork/stock"
    overlay = variants.install_overlay(layout, base)
    rows = []
    for case in cases:
        _, _, backend, topology, _ = case
        cpu = pinned_cpu(topology, accelerator)
        topo_env = topologies.env_for(backend, topology, accelerator)
        envs = {
            v: variants.child_env(dirs[v], overlay, topo_env)
            for v in ("stock", "fork")
        }
        row = _case_row(case, cpu, *_measure_case(case, rounds, envs, cpu))
        console.print(
            f"{row['case']} ({backend}/{topology}): {label} "
            f"{row['ratio']:.3f} "
            f"[{row['ratio_ci_low']:.3f}, {row['ratio_ci_high']:.3f}], "
            f"rounds {row['ratio_min']:.3f}..{row['ratio_max']:.3f}"
        )
        rows.append(row)
    return _run_doc(
        base, accelerator, rows, rounds=rounds, method=METHOD, aa=aa
    )


def _run_doc(base, accelerator, rows, **kind):
    """A run's document: base, date, machine, ``kind`` (rounds, A/A or
    work) and its rows (``cases``)."""
    return {
        "base": base.version,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{accelerator.upper()}",
        **kind,
        "cases": rows,
    }


# Step workloads whose work per step ``run_work`` counts.
WORK_WORKLOADS = (
    "stateless_call",
    "fit_step",
    "ddp_step",
    "dp_fit_step",
    "jax_procs_fit_step",
)
WORK_EPOCHS = 4
WORK_BEGIN = "<!-- bench-work:begin -->"
WORK_END = "<!-- bench-work:end -->"
# docs/upstream.md's collectives per step of each master PR alone.
ALONE_BEGIN = "<!-- bench-alone:begin -->"
ALONE_END = "<!-- bench-alone:end -->"


def _work_cases(cases):
    """The ``cases`` whose work ``run_work`` can count (``WORK_WORKLOADS``),
    each with its options set to count: ``work=True``, and
    ``WORK_EPOCHS`` epochs where it has epochs."""
    for case, workload, backend, topology, opts in cases:
        if workload not in WORK_WORKLOADS:
            continue
        opts = dict(opts, work=True)
        if "epochs" in opts:
            opts["epochs"] = WORK_EPOCHS
        yield case, workload, backend, topology, opts


def run_work(layout, base, accelerator, cases, console):
    """Counts the work per step of each step case, stock and fork.

    Timings resolve a fork cost to a few percent at best (the intervals of
    the paired turns end 1..6% above their ratios on the 2-core CI
    host); counts resolve a single call. Per case, one process per variant
    reports (``keras_fork.bench.worker``, ``"work"``):

    * the Python function calls per step (per call for ``stateless_call``)
      in each of ``WORK_EPOCHS`` epochs after the compiling one. A row
      keeps the smallest: the epochs differ only by how often the main
      thread polls a background thread (JAX's prefetch), which adds calls
      and never removes them.
    * the compiled training step's size and digest (``compiled_step``):
      the same digest means the same XLA program (JAX) or the same op
      counts by type (TensorFlow) every step.

    Returns:
        The ``dist/bench-work.json`` document: rows of ``case``,
        ``backend``, ``topology``, ``stock_calls``/``fork_calls`` (per
        step), ``*_calls_max`` (the largest epoch's), ``stock_graph``/
        ``fork_graph`` (``compiled_step`` or ``None``).
    """
    dirs = dict(variants.install_variants(layout, base))
    overlay = variants.install_overlay(layout, base)
    rows = []
    for case, workload, backend, topology, opts in _work_cases(cases):
        row = {"case": case, "backend": backend, "topology": topology}
        for variant in ("stock", "fork"):
            result = _run_worker(
                dirs[variant],
                overlay,
                workload,
                backend,
                topology,
                opts,
                accelerator,
            )
            row[f"{variant}_calls"] = min(result["calls_per_step"])
            row[f"{variant}_calls_max"] = max(result["calls_per_step"])
            row[f"{variant}_graph"] = result["graph"]
        row["date"] = datetime.date.today().isoformat()
        console.print(
            f"{case} ({backend}/{topology}): calls/step "
            f"{row['stock_calls']:.1f} -> {row['fork_calls']:.1f}, "
            f"compiled step {_graph_text(row)}"
        )
        rows.append(row)
    return _run_doc(base, accelerator, rows, rounds=1, work=True)


def _alone_variants(layout, base, console, prs=None):
    """``[(k, patch name, keras folder or None, why not)]`` for each PR of
    ``base`` in submission order (``submission.read_submission``), or only
    those numbered in ``prs``: the stock sdist plus that PR's source alone
    (``variants.install_prerequisites``, as ``stock+pr<k>``), or None with
    the reason where it does not apply alone.

    Raises:
        ForkError: a number in ``prs`` is not a PR of the series (named,
            with the valid ones).
    """
    in_order = submission.read_submission(layout, base)
    unknown = [k for k in prs or () if not 1 <= k <= len(in_order)]
    if unknown:
        raise ForkError(
            f"unknown --pr {', '.join(map(str, unknown))}; valid: "
            f"1..{len(in_order)} (the {base.version} series, in "
            "submission order)"
        )
    out = []
    for k, patch in enumerate(in_order, start=1):
        if prs and k not in prs:
            continue
        try:
            folder = variants.install_prerequisites(
                layout, base, (f"pr{k}",), [patch]
            )
        except variants.PrerequisiteError as e:
            out.append((k, patch.name, None, str(e)))
            continue
        console.print(f"PR {k} alone: {folder}")
        out.append((k, patch.name, folder, None))
    return out


def _collectives(graph) -> dict | None:
    """The collective counts of a worker's ``graph`` report: in the
    compiled step, and the eager reductions a step runs outside it."""
    if not graph or "collectives" not in graph:
        return None
    return {
        "step": graph["collectives"],
        "eager": graph.get("eager_per_step", 0),
    }


def run_alone(layout, base, accelerator, cases, console, prs=None):
    """Counts the collectives per step of each PR of ``base`` (or of the
    PRs numbered in ``prs``) applied alone to stock (issue 38: "count
    collectives per step on master, with and without each PR alone"), for
    the step cases that report them (``bench.worker``: TensorFlow's
    reductions while tracing, JAX's HLO collectives, the torch process
    group's collectives in a ``fit()`` over processes; torch's one-process
    and DDP-loop cases report none).

    Returns:
        The ``dist/bench-alone.json`` document: rows of ``case``,
        ``backend``, ``topology``, ``pr`` (its number in submission
        order), ``patch``, ``stock`` and ``alone`` (``{"step", "eager"}``
        or None), ``error`` (why the PR was not counted, or None) and
        ``date``.

    Raises:
        ForkError: a number in ``prs`` is not a PR of the series.
    """
    alone = _alone_variants(layout, base, console, prs)
    stock = variants.install_variants(layout, base)["stock"]
    overlay = variants.install_overlay(layout, base)
    rows = []
    for case, workload, backend, topology, opts in _work_cases(cases):
        args = (overlay, workload, backend, topology, opts, accelerator)
        before = _collectives(_run_worker(stock, *args)["graph"])
        for k, name, folder, error in alone:
            after = None
            if folder is not None:
                after = _collectives(_run_worker(folder, *args)["graph"])
            row = {"case": case, "backend": backend, "topology": topology}
            row.update(pr=k, patch=name, stock=before, alone=after)
            today = datetime.date.today().isoformat()
            rows.append(dict(row, error=error, date=today))
            console.print(f"{case} ({backend}/{topology}) PR {k}: {after}")
    return _run_doc(base, accelerator, rows, rounds=1, alone=True)


def merge_alone(previous, doc, submission):
    """Puts the rows of ``doc`` (a ``run_alone`` of some PRs) into
    ``previous``, the last ``dist/bench-alone.json`` run of the same base.

    Args:
        previous: that run's document, or None.
        doc: the new run's document.
        submission: the patch names of the series in submission order: a
            previous row is kept only where its PR number still names the
            same patch (a renumbered or reworked-and-renamed PR's old
            counts are dropped, not shown under its new number).

    Returns:
        ``doc`` with the previous rows it did not count again (same case,
        topology and PR), sorted by PR; ``doc`` alone where ``previous``
        ran on another machine.
    """
    if not previous or previous.get("machine") != doc["machine"]:
        return doc
    counted = {(r["case"], r["topology"], r["pr"]) for r in doc["cases"]}
    rows = [
        dict(r, date=r.get("date", previous["date"]))
        for r in previous["cases"]
        if (r["case"], r["topology"], r["pr"]) not in counted
        and 0 < r["pr"] <= len(submission)
        and submission[r["pr"] - 1] == r["patch"]
    ]
    rows = sorted(rows + doc["cases"], key=lambda r: r["pr"])
    return dict(doc, cases=rows)


def render_alone_table(doc) -> str:
    """The docs/upstream.md table of a ``run_alone`` document: a row a
    PR, a column a case, ``stock -> with the PR alone`` collectives per
    step (eager reductions per step after a ``+``)."""
    cases = list(
        dict.fromkeys((r["case"], r["topology"]) for r in doc["cases"])
    )
    head = " | ".join(f"{c} ({t})" for c, t in cases)
    lines = [
        f"_keras {doc['base']}, {doc['machine']}, {_date_range(doc)}; "
        "collectives per step, master -> master with the PR alone._",
        "",
        f"| PR | {head} |",
        "|---|" + "---|" * len(cases),
    ]
    by_pr = {}
    for r in doc["cases"]:
        by_pr.setdefault(r["pr"], {})[(r["case"], r["topology"])] = r
    for k, cells in sorted(by_pr.items()):
        texts = [_alone_text(cells.get(c)) for c in cases]
        lines.append(f"| {k} | " + " | ".join(texts) + " |")
    return "\n".join(lines) + "\n"


def _alone_text(row) -> str:
    if row is None:
        return "-"
    if row["error"]:
        return "does not apply alone"
    stock, alone = row["stock"], row["alone"]
    if stock is None or alone is None:
        return "not counted"

    def one(c):
        return f"{c['step']}" + (f" + {c['eager']:g}" if c["eager"] else "")

    before, after = one(stock), one(alone)
    return f"{before} -> {after}" + (" (same)" if before == after else "")


def _graph_text(row) -> str:
    stock, fork = row["stock_graph"], row["fork_graph"]
    if stock is None and fork is None:
        return "- (eager)"
    if (stock or fork).get("kind") == "eager":  # torch: collectives only
        return "- (eager)" + _collectives_text(stock, fork)
    if stock and fork and stock["digest"] == fork["digest"]:
        text = f"same {stock['kind']} ({stock['ops']} ops)"
    else:
        sizes = "/".join(str(g["ops"]) if g else "-" for g in (stock, fork))
        text = f"differs: {(stock or fork)['kind']} {sizes} ops"
    return text + _collectives_text(stock, fork)


def _collectives_text(stock, fork) -> str:
    """``"; collectives/step 1 -> 2"`` (plus the eager reductions a step
    runs outside the graph, where any), or ``""`` when not counted."""
    if not (
        stock and fork and "collectives" in stock and "collectives" in fork
    ):
        return ""
    text = f"; collectives/step {stock['collectives']} -> {fork['collectives']}"
    if stock.get("eager_per_step") or fork.get("eager_per_step"):
        text += (
            f", eager reductions/step {stock.get('eager_per_step', 0):g} -> "
            f"{fork.get('eager_per_step', 0):g}"
        )
    return text


def render_work_table(doc) -> str:
    """The docs/benchmarks.md table of a ``run_work`` document."""
    lines = [
        f"_keras {doc['base']}, {doc['machine']}, {_date_range(doc)}; Python "
        "calls per step (per call for stateless_call): the fewest of "
        f"{WORK_EPOCHS} epochs, fork - stock; compiled step: stock vs "
        "fork._",
        "",
        "| case | backend | topology | calls/step stock | fork | "
        "fork - stock | compiled step |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["cases"]:
        lines.append(
            f"| {r['case']} | {r['backend']} | {r['topology']} | "
            f"{r['stock_calls']:.1f} | {r['fork_calls']:.1f} | "
            f"{r['fork_calls'] - r['stock_calls']:+.1f} | {_graph_text(r)} |"
        )
    return "\n".join(lines) + "\n"


def _row_key(row) -> tuple:
    return (row["case"], row["backend"], row["topology"])


def merge(previous, doc):
    """Puts the rows of ``doc`` (a run of some cases) into ``previous``.

    Args:
        previous: the last ``dist/bench.json`` run of the same base, or
            ``None``.
        doc: the new run's document (``run``).

    Returns:
        ``doc`` with the rows of ``previous`` that it does not measure again
        (same case, backend and topology), all in ``CASES`` order; cases
        no longer listed come last. ``doc`` alone when ``previous`` was
        measured on another machine, with another number of rounds, by
        another method or as another kind of run (A/A or not), whose rows
        would not compare.
    """
    if (
        not previous
        or previous.get("machine") != doc["machine"]
        or previous.get("rounds") != doc["rounds"]
        or previous.get("method") != doc.get("method")
        or previous.get("aa", False) != doc.get("aa", False)
    ):
        return doc
    measured = {_row_key(r) for r in doc["cases"]}
    rows = [r for r in previous["cases"] if _row_key(r) not in measured]
    rows += doc["cases"]
    order = {(c[0], c[2], c[3]): i for i, c in enumerate(CASES)}
    rows.sort(key=lambda r: order.get(_row_key(r), len(order)))
    return dict(doc, cases=rows)


def _date_range(doc) -> str:
    """The day the rows of ``doc`` were measured, or the first..last day
    (rows kept from an earlier run by ``merge``)."""
    dates = sorted({r.get("date", doc["date"]) for r in doc["cases"]})
    return dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"


def render_table(doc) -> str:
    """The docs/benchmarks.md table of a ``run`` document."""
    date = _date_range(doc)
    pair, what = "stock and fork taking turns", "fork/stock"
    if doc.get("aa"):
        pair = (
            "stock and stock taking turns (A/A run: the fork column is "
            "stock again)"
        )
        what = "stock/stock"
    lines = [
        f"_keras {doc['base']}, {doc['machine']}, {date}, {doc['rounds']} "
        f"rounds of {pair}; ratio: the median of the "
        f"paired {what} ratios [95% interval, rounds and pairs "
        "resampled] (the rounds' medians, min..max); single-device cases "
        "pinned to one core._",
        "",
        "| case | backend | topology | stock | fork | ratio | pairs | "
        "peak MiB stock/fork |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["cases"]:
        lines.append(
            f"| {r['case']} | {r['backend']} | {r['topology']} | "
            f"{r['stock_median_s'] * 1e3:.3f} ms | "
            f"{r['fork_median_s'] * 1e3:.3f} ms | {r['ratio']:.3f} "
            f"[{r['ratio_ci_low']:.3f}, {r['ratio_ci_high']:.3f}] "
            f"({r['ratio_min']:.2f}..{r['ratio_max']:.2f}) | {r['pairs']} | "
            f"{r['stock_peak_mib']:.0f}/{r['fork_peak_mib']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def select_cases(names=None, backends=None, topologies_=None):
    """The ``CASES`` whose name contains one of ``names`` and whose backend
    and topology are among ``backends`` and ``topologies_`` (each filter
    ``None`` or empty: any), in ``CASES`` order."""
    return [
        c
        for c in CASES
        if (not names or any(s in c[0] for s in names))
        and (not backends or c[2] in backends)
        and (not topologies_ or c[3] in topologies_)
    ]


def _with_enough_gpus(cases, console):
    """The cases whose topology has the GPUs it needs here
    (``topologies.gpu_shortfall``); says which are skipped and why."""
    gpus = len(topologies.visible_gpus())
    kept = []
    for case in cases:
        name, _, backend, topology, _ = case
        why = topologies.gpu_shortfall(backend, topology, gpus)
        if why:
            console.print(f"skipped {name} ({backend}/{topology}): {why}")
        else:
            kept.append(case)
    return kept


def add_arguments(p) -> None:
    """The ``bench`` verb's filters and options."""
    p.add_argument("--base", default=None, help="base version (default: all)")
    p.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="fresh stock and fork processes per case, each taking turns "
        "for the case's repetitions",
    )
    p.add_argument("--case", action="append", help="substring of case names")
    p.add_argument("--backend", action="append", help="only this backend")
    p.add_argument(
        "--topology", action="append", help="only this topology (e.g. 1)"
    )
    p.add_argument(
        "--accelerator",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="where the steps run (default auto: the GPUs where torch or "
        "jax sees one, else the CPU)",
    )
    p.add_argument(
        "--docs",
        "--readme",
        dest="docs",
        action="store_true",
        help=f"also rewrite the committed table, docs/{DOCS_FILE} "
        "(--readme: its old name)",
    )
    p.add_argument(
        "--aa",
        action="store_true",
        help="A/A: measure stock against itself (noise floor), into "
        "dist/bench-aa.json",
    )
    p.add_argument(
        "--work",
        action="store_true",
        help="count Python calls per step and compare the compiled steps "
        "instead of timing, into dist/bench-work.json",
    )
    p.add_argument(
        "--pr",
        type=int,
        action="append",
        help="with --alone: only this PR (its number in submission order; "
        "repeatable); the other PRs keep their rows from the last "
        "dist/bench-alone.json",
    )
    p.add_argument(
        "--alone",
        action="store_true",
        help="with --work: count the collectives per step of each PR of the "
        "series applied alone to stock, in submission order, into "
        "dist/bench-alone.json (--docs: docs/upstream.md)",
    )


def _selected_cases(args):
    """The cases ``args`` select (``select_cases``).

    Raises:
        ForkError: a refused option combination, or no case matches.
    """
    if args.rounds < 1:
        raise ForkError("--rounds must be at least 1")
    if args.aa and args.docs:
        raise ForkError(
            f"--aa measures no fork: it does not go into docs/{DOCS_FILE}"
        )
    if args.aa and args.work:
        raise ForkError("--work counts, stock and fork once each: no A/A run")
    if args.alone and not args.work:
        raise ForkError("--alone counts collectives: it needs --work")
    if args.pr and not args.alone:
        raise ForkError("--pr picks the PRs of --alone: it needs --alone")
    check_known("--backend", args.backend, {c[2] for c in CASES})
    check_known("--topology", args.topology, {c[3] for c in CASES})
    names = {n for n in args.case or () if any(n in c[0] for c in CASES)}
    check_known("--case", args.case, names | {c[0] for c in CASES})
    cases = select_cases(args.case, args.backend, args.topology)
    if not cases:
        raise ForkError("no case matches --case/--backend/--topology")
    return cases


def cases_on_base(cases, version: str):
    """The ``cases`` that run on the base ``version``: those without a
    ``since`` option, or whose ``since`` it is at least (e.g. Keras
    ``fit()`` over torch processes, which only master has)."""
    return [
        c for c in cases if Version(version) >= Version(c[4].get("since", "0"))
    ]


def _measure_bases(args, layout, accelerator, cases, console):
    """One document a selected base (that any of ``cases`` runs on:
    ``cases_on_base``): ``run_work`` with ``--work``, else ``run``."""
    docs = []
    for b in pins.select_bases(layout, [args.base] if args.base else None):
        cases_b = cases_on_base(cases, b.version)
        if not cases_b:
            console.print(f"skipped {b.version}: no selected case runs on it")
            continue
        if args.alone:
            doc = run_alone(layout, b, accelerator, cases_b, console, args.pr)
        elif args.work:
            doc = run_work(layout, b, accelerator, cases_b, console)
        else:
            doc = run(
                layout, b, args.rounds, accelerator, cases_b, console, args.aa
            )
        docs.append(doc)
    return docs


def _last_runs(out) -> dict:
    """The runs of ``out``, the last run's file, by base; ``{}`` where it
    has none that can be read."""
    try:
        return {d["base"]: d for d in json.loads(out.read_text())["runs"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # no usable last run: this one stands alone


def _merge_last_run(out, docs):
    """``docs`` each merged (``merge``) with the same base's run in
    ``out``, the last run's file; ``docs`` alone where it has none."""
    previous = _last_runs(out)
    return [merge(previous.get(d["base"]), d) for d in docs]


def _merge_last_alone(layout, out, docs):
    """``docs`` (``run_alone`` of some PRs) each merged (``merge_alone``)
    with the same base's run in ``out``, the last ``--alone`` file."""
    previous = _last_runs(out)
    merged = []
    for doc in docs:
        base = pins.select_bases(layout, [doc["base"]])[0]
        names = [p.name for p in submission.read_submission(layout, base)]
        merged.append(merge_alone(previous.get(doc["base"]), doc, names))
    return merged


def main(args, layout: pins.Layout) -> int:
    """``python -m keras_fork bench``: measures (or, with ``--work``,
    counts) the selected cases of each base, writes ``dist/bench*.json``,
    prints the table and, with ``--docs``, puts it in docs/benchmarks.md.

    Returns:
        0.

    Raises:
        ForkError: a refused option combination, no case matches, or a
            base or worker failed.
    """
    from rich.console import Console

    cases = _selected_cases(args)
    docs_file = DOCS_FILE
    if args.alone:
        name, render = "bench-alone.json", render_alone_table
        markers, docs_file = (ALONE_BEGIN, ALONE_END), "upstream.md"
    elif args.work:
        name, render = "bench-work.json", render_work_table
        markers = (WORK_BEGIN, WORK_END)
    else:
        name = "bench-aa.json" if args.aa else "bench.json"
        render, markers = render_table, (DOCS_BEGIN, DOCS_END)
    console = Console(stderr=True, highlight=False)
    accelerator = args.accelerator
    if accelerator == "auto":
        accelerator = variants.detect_accelerator()
    if accelerator == "gpu":
        cases = _with_enough_gpus(cases, console)
    docs = _measure_bases(args, layout, accelerator, cases, console)
    out = layout.dist / name
    if args.alone and args.pr:
        docs = _merge_last_alone(layout, out, docs)
    elif (args.case or args.backend or args.topology) and not args.alone:
        docs = _merge_last_run(out, docs)
    write_atomic(out, json.dumps({"runs": docs}, indent=2) + "\n")
    table = "\n".join(render(d) for d in docs)
    print(table)
    if args.docs:
        replace_between(layout.docs / docs_file, *markers, table)
    return 0
