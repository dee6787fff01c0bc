"""The topologies a proof test runs on, declared as a marker and decided at
collection.

``@pytest.mark.topology(...)`` (on a test, a class or a module's
``pytestmark``) names what a test needs of its topology; on any other
topology the test is skipped at collection (a ``pytest.mark.skip``, before
any fixture starts), with a reason that starts with its category:

* ``wrong backend``: no topology of this backend has what the test needs;
* ``too few devices``: this topology has one replica, and one of this
  backend with more replicas has what it needs;
* ``not applicable on this topology``: any other topology.

Conditions (all that are given must hold; every marker of a test must):

* names: ``topology("dp-2")``, ``topology("ddp-2", "dp-2")``: the
  topology's name is one of them, on whichever backend has it;
* ``exclude=("ddp-2",)``: the name is none of them;
* ``backend="tensorflow"`` (or a tuple of backends);
* ``multi_process=True|False``: the replicas are worker processes
  (``topologies.MULTI_PROCESS``);
* ``multi_replica=True|False``: more than one replica
  (``topologies.TOPOLOGIES``);
* ``strategy=True|False``: the test process trains under a
  ``tf.distribute`` strategy (``topologies.has_strategy``);
* ``reason="..."``: why, after the category (default: the conditions that
  do not hold).

The topology is known from ``KERAS_BACKEND`` and ``PROOF_TOPOLOGY``
(``topologies.from_env``) without starting a backend. What only the test
process knows (GPUs, the devices ``jax/8`` gets on them, a
``devices.skip_comparison_on_one_device``) stays a ``pytest.skip`` in the
test's body, its reason starting with one of the categories too.
"""

from __future__ import annotations

import dataclasses

import pytest

from . import topologies

WRONG_BACKEND = "wrong backend"
TOO_FEW_DEVICES = "too few devices"
NOT_APPLICABLE = "not applicable on this topology"
# The order in which a test's unmet markers give its reason.
CATEGORIES = (WRONG_BACKEND, TOO_FEW_DEVICES, NOT_APPLICABLE)
# Not a topology's: the reason of a ``fix(absent_since=...)`` or
# ``fix(absent_before=...)`` skip
# (``selection.absent_reason``), where the base under test lacks what the
# test checks.
NOT_ON_BASE = "not applicable on this base"
MARKERS = (
    "equivalence: a test of the equivalence suite (equivalence/ beside "
    "harness/), which proves no fix: exempt from the fix marker",
    "fix(name, role=, guard_on=, guard_since=, absent_since=, "
    "absent_before=): the fix "
    "(fixes/<id>/fix.toml) a proof test proves (harness.selection)",
    "topology(*names, exclude=, backend=, multi_process=, multi_replica=, "
    "strategy=, reason=): the topologies a test runs on; elsewhere it is "
    "skipped at collection (harness.markers)",
)
FLAGS = ("multi_process", "multi_replica", "strategy")


def register(config) -> None:
    """Declares the ``fix`` and ``topology`` markers (``pytest --markers``;
    no unknown-marker warning without this repository's setup.cfg)."""
    for line in MARKERS:
        config.addinivalue_line("markers", line)


@dataclasses.dataclass(frozen=True)
class Cell:
    """What collection knows of a backend's topology: its table entries
    (``topologies``), no devices."""

    backend: str
    name: str

    @property
    def multi_process(self) -> bool:
        return (self.backend, self.name) in topologies.MULTI_PROCESS

    @property
    def multi_replica(self) -> bool:
        return topologies.TOPOLOGIES[(self.backend, self.name)][0] > 1

    @property
    def strategy(self) -> bool:
        return topologies.has_strategy(self.backend, self.name)

    def others(self) -> list[Cell]:
        """Every topology of this backend, this one included."""
        return [
            Cell(b, n) for b, n in topologies.TOPOLOGIES if b == self.backend
        ]


@dataclasses.dataclass(frozen=True)
class Need:
    """The conditions of one ``topology`` marker."""

    names: tuple = ()
    exclude: tuple = ()
    backend: tuple = ()
    multi_process: bool | None = None
    multi_replica: bool | None = None
    strategy: bool | None = None
    reason: str | None = None

    @classmethod
    def of(cls, marker, where: str) -> Need:
        """Raises ``pytest.UsageError``: an unknown keyword, topology name
        or backend, or no condition at all."""
        kwargs = dict(marker.kwargs)
        unknown = set(kwargs) - {f.name for f in dataclasses.fields(cls)}
        for key in ("exclude", "backend"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = (kwargs[key],)
        if unknown:
            raise pytest.UsageError(f"{where}: topology({sorted(unknown)}?)")
        need = cls(names=tuple(marker.args), **kwargs)
        names = {n for _, n in topologies.TOPOLOGIES}
        backends = {b for b, _ in topologies.TOPOLOGIES}
        wrong = (set(need.names) | set(need.exclude)) - names
        wrong |= set(need.backend) - backends
        wrong |= {f for f in FLAGS if getattr(need, f) not in (None, 0, 1)}
        if wrong or need == cls(reason=need.reason):
            raise pytest.UsageError(
                f"{where}: topology marker {marker}: unknown {sorted(wrong)}"
                " or no condition"
            )
        return need

    def unmet(self, cell: Cell) -> list[str]:
        """What ``cell`` lacks, one phrase a condition; empty if none."""
        phrases = []
        if self.names and cell.name not in self.names:
            phrases.append(f"runs on topology {' or '.join(self.names)} only")
        if cell.name in self.exclude:
            phrases.append(f"does not run on topology {cell.name}")
        if self.backend and cell.backend not in self.backend:
            phrases.append(f"runs on {' or '.join(self.backend)} only")
        for flag in FLAGS:
            wanted = getattr(self, flag)
            if wanted is not None and wanted != getattr(cell, flag):
                phrases.append(PHRASES[flag][wanted])
        return phrases

    def category(self, cell: Cell) -> str:
        """Why ``cell`` (which this need does not meet) cannot run it."""
        met = [other for other in cell.others() if not self.unmet(other)]
        if not met:
            return WRONG_BACKEND
        if not cell.multi_replica and any(c.multi_replica for c in met):
            return TOO_FEW_DEVICES
        return NOT_APPLICABLE


PHRASES = {
    "multi_process": {
        True: "runs in worker processes only",
        False: "a single-process test",
    },
    "multi_replica": {
        True: "needs more than one replica",
        False: "runs on one replica only",
    },
    "strategy": {
        True: "needs a tf.distribute strategy (mirrored-N)",
        False: "runs without a tf.distribute strategy only",
    },
}


def skip_reason(item, cell: Cell) -> str | None:
    """Why ``item`` does not run on ``cell``, or None where it runs:
    ``"<category>: <why>"`` of its first unmet marker of the first
    category of ``CATEGORIES``, in reading order (the module's, the
    class's, then the test's decorators top down)."""
    found = []
    for marker in reversed(list(item.iter_markers("topology"))):
        need = Need.of(marker, item.nodeid)
        unmet = need.unmet(cell)
        if unmet:
            why = need.reason or "; ".join(unmet)
            found.append((CATEGORIES.index(need.category(cell)), why))
    if not found:
        return None
    index, why = min(found, key=lambda f: f[0])
    return f"{CATEGORIES[index]}: {why}"


def pytest_collection_modifyitems(config, items):
    """Marks ``pytest.mark.skip`` every item whose ``topology`` markers this
    process's topology (``topologies.from_env``) does not meet.

    Raises:
        pytest.UsageError: an unknown topology, or a bad marker.
    """
    backend, name = topologies.from_env()
    if not topologies.known(backend, name):
        raise pytest.UsageError(f"unknown topology {backend}/{name}")
    cell = Cell(backend, name)
    for item in items:
        reason = skip_reason(item, cell)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
