"""The benchmark cases: what each measures, where, with which options.

A case is ``(name, workload, backend, topology, options)``: ``workload``
names a function of ``keras_fork.bench.worker``; the options are its
``opts``.
"""

from __future__ import annotations

from packaging.version import Version

from integration_tests.harness import topologies

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
    # length (jax-unknown-steps compares them before each step). NumPy
    # inputs there need 3.15.1 of the pinned bases (3.7.0 raises: "the data
    # must be provided as a `tf.data.Dataset`").
    ("fit step, MLP + accuracy/AUC", "jax_procs_fit_step", "jax", "procs-2",
     {"samples": 4096, "batch_size": 64, "epochs": 4, "metrics": True,
      "processes": 2, "since": "3.15.1"}),
    ("fit step, MLP + accuracy/AUC, unknown length", "jax_procs_fit_step",
     "jax", "procs-2", {"samples": 4096, "batch_size": 64, "epochs": 4,
                        "metrics": True, "processes": 2,
                        "input": "tf.data-filter"}),
]  # fmt: skip


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


def with_enough_gpus(cases, gpus: int, console):
    """The cases whose topology has the GPUs it needs on ``gpus`` GPUs
    (``topologies.gpu_shortfall``); says which are skipped and why."""
    kept = []
    for case in cases:
        name, _, backend, topology, _ = case
        why = topologies.gpu_shortfall(backend, topology, gpus)
        if why:
            console.print(f"skipped {name} ({backend}/{topology}): {why}")
        else:
            kept.append(case)
    return kept


def cases_on_base(cases, version: str):
    """The ``cases`` that run on the base ``version``: those without a
    ``since`` option, or whose ``since`` it is at least (e.g. Keras
    ``fit()`` over torch processes, which only master has)."""
    return [
        c for c in cases if Version(version) >= Version(c[4].get("since", "0"))
    ]


# Step workloads whose work per step ``run_work`` counts.
WORK_WORKLOADS = (
    "stateless_call",
    "fit_step",
    "ddp_step",
    "dp_fit_step",
    "jax_procs_fit_step",
)
WORK_EPOCHS = 4


def work_cases(cases):
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
