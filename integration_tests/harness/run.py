"""One way to run a fix's tests: a bounded pytest process per backend and
topology, whichever keras it imports.

``verify`` (any installed keras) and the proof matrix of ``keras_fork``
(stock against fork) both start their pytest processes through this
module: the same command line (``pytest_command``), the same environment
for a topology (``fixes_env``, from ``topology_env``), the same
bound on a run that stops making progress (``run_bounded``), and the same
reading of the JUnit file it writes (``junit.read_junit``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import progress as progress_plugin
from . import selection
from . import topologies


def fix_folder(fixes: Path, fix: str) -> Path:
    """The folder of fix ``fix`` under ``fixes``: its id with ``-`` as
    ``_`` (a Python package, so that workers import its tests by name)."""
    return fixes / fix.replace("-", "_")


def pytest_command(
    paths, junit: Path, timeout: float, plugins=(), rootdir=None, extra=()
) -> list[str]:
    """The command line of one run: this interpreter's pytest on ``paths``
    (folders or files), quiet, with the progress plugin
    (``harness.progress``) and ``plugins`` (module names), the reasons of
    failures and errors, an xunit1 JUnit file at ``junit``
    (``junit.read_junit`` reads it), no cache folder, ``timeout`` seconds a
    test (pytest-timeout), ``rootdir`` as pytest's root where given, and
    ``extra`` options.
    """
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-p",
        progress_plugin.__name__,
        *[arg for name in plugins for arg in ("-p", name)],
        "-rfE",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit1",
        f"--timeout={int(timeout)}",
        *(("--rootdir", str(rootdir)) if rootdir else ()),
        *extra,
        *[str(p) for p in paths],
    ]


def fixes_env(
    backend: str,
    topology: str,
    accelerator: str,
    fixes,
    progress: Path,
    base: str | None = None,
) -> dict[str, str]:
    """The variables a run sets for its process, over the environment it
    inherits: its topology's (``topology_env``), the fixes whose
    tests it collects (``selection.ENV``), the base whose cells they are
    (``PROOF_BASE``, read by ``selection.role_of``; none: no base) and
    the progress file (``harness.progress``).

    Raises:
        KeyError: unknown (backend, topology).
    """
    env = topology_env(backend, topology, accelerator)
    env[selection.ENV] = ",".join(fixes)
    env[progress_plugin.ENV] = str(progress)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if base:
        env[selection.BASE_ENV] = base
    return env


def topology_env(
    backend: str, topology: str, accelerator: str
) -> dict[str, str]:
    """``topologies.env_for`` on this machine's GPUs (``visible_gpus``,
    asked on GPUs only).

    Raises:
        KeyError: unknown (backend, topology).
        ValueError: one-GPU mode for a topology it does not run.
    """
    gpus = visible_gpus() if accelerator != "cpu" else []
    return topologies.env_for(backend, topology, accelerator, gpus)


def run_captured(cmd, env=None, timeout=None):
    """Runs ``cmd`` to its end, its output captured as text.

    Returns:
        The ``subprocess.CompletedProcess``, whatever its exit status.

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout`` seconds.
    """
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=timeout
    )


def visible_gpus() -> list[str]:
    """The GPUs this process may use, named as ``CUDA_VISIBLE_DEVICES``
    names them: that variable's entries where it is set (set but empty:
    none), else the indices of the GPUs ``nvidia-smi -L`` lists (none
    without ``nvidia-smi`` or where it fails).

    Raises:
        subprocess.TimeoutExpired: ``nvidia-smi`` ran over 60 seconds.
    """
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        names = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        return [n.strip() for n in names if n.strip()]
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    out = run_captured([exe, "-L"], timeout=60)
    if out.returncode != 0:
        return []
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("GPU ")]
    return [str(i) for i in range(len(lines))]


def run_bounded(
    cmd, cwd, env, log: Path, limit: float, progress: Path | None = None
) -> int | None:
    """Runs ``cmd`` in its own session with its output in ``log``.

    Args:
        limit: seconds the run may take; with ``progress``, seconds it may
            go without the ``progress`` file growing (``harness.progress``
            writes a line as each test starts and ends).

    Returns:
        The exit status, or None when it ran past ``limit``: its whole
        process group is then killed (SIGKILL) and reaped. Whatever the
        run leaves behind in its group (e.g. a test's worker processes) is
        killed when it ends either way.
    """
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return _wait(proc, limit, progress)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _wait(proc, limit: float, progress: Path | None) -> int | None:
    """``proc``'s exit status, or None once it went ``limit`` seconds
    without ending (or without ``progress`` growing); then reaped."""
    last, size = time.monotonic(), _size(progress)
    while True:
        try:
            return proc.wait(timeout=min(1.0, limit))
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if progress is not None and _size(progress) != size:
                last, size = now, _size(progress)
            if now - last > limit:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return None


def _size(path: Path | None) -> int:
    """``path``'s size in bytes; -1 when there is no such file."""
    try:
        return path.stat().st_size
    except (AttributeError, OSError):
        return -1
