"""Command-line options of a matrix of cells, declared once: for ``verify``
(here) and the tool's ``prove``, ``bench-matrix`` and ``bench``
(``keras_fork.options``)."""

from __future__ import annotations

ACCELERATORS = ("auto", "cpu", "gpu")


def add_cell_filters(p, names=("fix", "backend", "topology")) -> None:
    """``--<name> X`` (repeatable) for each of ``names``: only the cells
    with that fix, backend, topology (or base)."""
    for name in names:
        p.add_argument(
            f"--{name}",
            action="append",
            help=f"only this {name} (repeatable; an unknown one is named, "
            "with the valid ones)",
        )


def add_accelerator(p, runs: str, auto: str, more: str = "") -> None:
    """``--accelerator {auto,cpu,gpu}``: where ``runs`` (e.g. "the
    tests"), ``auto`` saying how auto decides, ``more`` what follows."""
    p.add_argument(
        "--accelerator",
        choices=ACCELERATORS,
        default="auto",
        help=f"where {runs} run (default auto: {auto}, else the CPU){more}",
    )


def add_timeout(p, more: str = "") -> None:
    """``--timeout S``: the seconds one test may take (default 600)."""
    p.add_argument(
        "--timeout",
        type=float,
        default=600,
        help=f"seconds a test may take (default 600){more}",
    )
