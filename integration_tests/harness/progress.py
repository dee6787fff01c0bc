"""A pytest plugin that writes which test a run is in, as it goes.

Loaded by the proof runner (``-p integration_tests.harness.progress``) with
``PROOF_PROGRESS`` naming a file: each test appends ``start <nodeid>`` when
it begins and ``end <nodeid>`` when its teardown is over, one line each,
written at once (``O_APPEND``, unbuffered). The runner reads the file while
the run goes on (a run with no new line for longer than a test may take is
hung: its process group is killed) and after it dies (the test that started
and never ended is the one that hung or crashed it). Without
``PROOF_PROGRESS`` the plugin does nothing.
"""

from __future__ import annotations

import os

ENV = "PROOF_PROGRESS"


def _write(line: str) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def pytest_runtest_logstart(nodeid, location):
    _write(f"start {nodeid}")


def pytest_runtest_logfinish(nodeid, location):
    _write(f"end {nodeid}")


def unfinished(path) -> str | None:
    """The node id of the test that started last and never ended in the
    progress file ``path``, or None (no such test, or no file)."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None
    open_tests = {}
    for line in lines:
        kind, _, nodeid = line.partition(" ")
        if kind == "start":
            open_tests[nodeid] = True
        elif kind == "end":
            open_tests.pop(nodeid, None)
    return next(reversed(open_tests), None) if open_tests else None
