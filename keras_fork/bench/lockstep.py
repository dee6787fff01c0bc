"""Timed runs: stock and fork workers taking turns (lockstep).

Each round of a case starts two ``keras_fork.bench.worker`` processes, stock
and fork, and, once both are warm, has them take turns (``LiveWorker``): one
repetition (an epoch, a batch of calls) of one, then of the other, in strict
alternation (``measure_round``), so that the two are never measured at the
same time and the machine's drift hits both alike. Each fork turn against
the stock turns around it gives a fork/stock ratio; a case reports the
medians, the median of its ratios with a bootstrap confidence interval
(``median_ci``), and the spread of the rounds (fresh processes: their
memory layout differs). Single-device cases on CPU run pinned to one core,
where a 2-core machine's scheduling noise is smallest.
"""

from __future__ import annotations

import datetime
import json
import os
import select
import socket
import statistics
import sys
import tempfile
import time

from integration_tests.harness import run as harness_run
from integration_tests.harness import workers
from keras_fork import process
from keras_fork.bench import tables
from keras_fork.errors import ForkError
from keras_fork.proof import variants
from keras_fork.recipe import pins

# How a run's timings were taken (``dist/bench.json``'s ``method``): rows of
# runs taken otherwise do not merge with a new run's.
METHOD = "lockstep"


class LiveWorker:
    """A benchmark worker that measures when told to (lockstep).

    The benchmark's side of ``protocol.Gate``: this listens on a free
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
        self.proc = process.start(
            cmd,
            env=env,
            cwd=pins.CODE_ROOT,
            stdout=self._out,
            stderr=self._err,
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
                except process.TimeoutExpired:
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
        except process.TimeoutExpired:
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


def _row_or_failure(case, rounds, envs, cpu, console, label):
    """``case``'s row (``_case_row``), printed; or, where a worker failed,
    ``{case, backend, topology, error}`` (the error's first line)."""
    _, _, backend, topology, _ = case
    try:
        measured = _measure_case(case, rounds, envs, cpu)
    except ForkError as e:
        error = (str(e).splitlines() or ["?"])[0]
        console.print(f"{case[0]} ({backend}/{topology}): failed: {error}")
        return dict(
            case=case[0], backend=backend, topology=topology, error=error
        )
    row = _case_row(case, cpu, *measured)
    console.print(
        f"{row['case']} ({backend}/{topology}): {label} "
        f"{row['ratio']:.3f} "
        f"[{row['ratio_ci_low']:.3f}, {row['ratio_ci_high']:.3f}], "
        f"rounds {row['ratio_min']:.3f}..{row['ratio_max']:.3f}"
    )
    return row


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

    A case whose worker fails (``LiveWorker``: every worker of the round
    is killed first) has no row; it is listed in the document's
    ``failed`` (``{case, backend, topology, error}``: the error's first
    line), and the other cases are measured.
    """
    dirs = dict(variants.install_variants(layout, base))
    if aa:
        dirs["fork"] = dirs["stock"]
    label = "stock/stock (A/A)" if aa else "fork/stock"
    overlay = variants.install_overlay(layout, base)
    rows, failed = [], []
    for case in cases:
        _, _, backend, topology, _ = case
        cpu = pinned_cpu(topology, accelerator)
        topo_env = harness_run.topology_env(backend, topology, accelerator)
        envs = {
            v: variants.child_env(dirs[v], overlay, topo_env)
            for v in ("stock", "fork")
        }
        row = _row_or_failure(case, rounds, envs, cpu, console, label)
        if "error" in row:
            failed.append(row)
        else:
            rows.append(row)
    return tables.run_doc(
        base,
        accelerator,
        rows,
        rounds=rounds,
        method=METHOD,
        aa=aa,
        failed=failed,
    )
