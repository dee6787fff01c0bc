"""Counted runs: the work per step of stock, fork and each PR alone.

Counts resolve what the timings' noise cannot: the Python calls per step
and the compiled training step of each step case (``run_work``), and the
collectives per step of each PR of a series applied alone to stock
(``run_alone``). One worker process per variant and case
(``run_worker``).
"""

from __future__ import annotations

import datetime
import json

from integration_tests.harness import run
from keras_fork import process
from keras_fork.bench import suite
from keras_fork.bench import tables
from keras_fork.errors import ForkError
from keras_fork.proof import variants
from keras_fork.recipe import pins
from keras_fork.recipe import submission


def run_worker(
    variant_dir, overlay, workload, backend, topology, opts, accelerator
):
    """Runs ``keras_fork.bench.worker`` once; returns its JSON document."""
    env = variants.child_env(
        variant_dir, overlay, run.topology_env(backend, topology, accelerator)
    )
    proc = process.run(
        process.python(
            "-m", "keras_fork.bench.worker", workload, json.dumps(opts)
        ),
        env=env,
        cwd=pins.CODE_ROOT,
        timeout=900,
    )
    if proc.returncode != 0:
        raise ForkError(
            f"benchmark {workload} ({backend}/{topology}) failed:\n"
            f"{proc.stderr[-2000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    * the compiled training step's size and digest (``counters.compiled_step``):
      the same digest means the same XLA program (JAX) or the same op
      counts by type (TensorFlow) every step.

    Returns:
        The ``dist/bench-work.json`` document: rows of ``case``,
        ``backend``, ``topology``, ``stock_calls``/``fork_calls`` (per
        step), ``*_calls_max`` (the largest epoch's), ``stock_graph``/
        ``fork_graph`` (``counters.compiled_step`` or ``None``).
    """
    dirs = dict(variants.install_variants(layout, base))
    overlay = variants.install_overlay(layout, base)
    rows = []
    for case, workload, backend, topology, opts in suite.work_cases(cases):
        row = {"case": case, "backend": backend, "topology": topology}
        for variant in ("stock", "fork"):
            result = run_worker(
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
            f"compiled step {tables._graph_text(row)}"
        )
        rows.append(row)
    return tables.run_doc(base, accelerator, rows, rounds=1, work=True)


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
    PRs numbered in ``prs``) applied alone to stock, for
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
    for case, workload, backend, topology, opts in suite.work_cases(cases):
        args = (overlay, workload, backend, topology, opts, accelerator)
        before = _collectives(run_worker(stock, *args)["graph"])
        for k, name, folder, error in alone:
            after = None
            if folder is not None:
                after = _collectives(run_worker(folder, *args)["graph"])
            row = {"case": case, "backend": backend, "topology": topology}
            row.update(pr=k, patch=name, stock=before, alone=after)
            today = datetime.date.today().isoformat()
            rows.append(dict(row, error=error, date=today))
            console.print(f"{case} ({backend}/{topology}) PR {k}: {after}")
    return tables.run_doc(base, accelerator, rows, rounds=1, alone=True)
