"""Every child process of the tool: ``run`` (to its end, output captured)
and ``start`` (a process the caller talks to), and the git and pip runs.

``python(*args)`` is this interpreter's command line. ``run_git`` runs git
and returns what it did, for the callers that read a failure (e.g. a patch
that does not apply); ``git`` returns its output and raises on failure.
Every pip run uses this interpreter's pip (``python -m pip``), quietly,
without its version check, installs or downloads no dependency, and builds
nothing in an isolated environment (the pinned stack is already installed;
the tool never reaches for another).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from keras_fork.errors import ForkError

# What ``run`` raises past its timeout, and a started process's ``wait``.
TimeoutExpired = subprocess.TimeoutExpired
_PIP = (sys.executable, "-m", "pip")
# Every run: quiet, no version check, no dependency, no isolated build.
_OPTIONS = (
    "-q",
    "--disable-pip-version-check",
    "--no-deps",
    "--no-build-isolation",
)


def run(cmd, *, env=None, cwd=None, timeout=None, input=None):
    """Runs ``cmd`` to its end, with ``env`` (None: this process's) in
    ``cwd``, ``input`` on its stdin.

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout`` seconds (it is
            killed first).
    """
    return subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        input=input,
    )


def start(cmd, *, env, cwd, stdout, stderr):
    """Starts ``cmd`` in its own session (its whole group can be killed),
    writing to the files ``stdout`` and ``stderr``; the ``subprocess.Popen``
    to wait for."""
    return subprocess.Popen(
        [str(c) for c in cmd],
        env=env,
        cwd=cwd,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )


def python(*args) -> list[str]:
    """This interpreter's command line with ``args`` (``-m module ...``)."""
    return [sys.executable, *map(str, args)]


def _pip(command: str, *args: str):
    return run([*_PIP, command, *_OPTIONS, *args])


def pip_download_sdist(requirement: str, dest: Path):
    """Downloads the sdist of ``requirement`` (never a wheel) into ``dest``.

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.
    """
    return _pip(
        "download", "--no-binary", ":all:", "-d", str(dest), requirement
    )


def pip_install(sources: list, target: Path, compile: bool = True):
    """Installs ``sources`` (wheels, sdists or folders) into the folder
    ``target`` (``pip install --target``), to be put first on a child
    process's ``PYTHONPATH``; without byte-compiling every module where
    not ``compile`` (``--no-compile``: an install that one or two
    processes import from compiles only what they import).

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.
    """
    no_compile = () if compile else ("--no-compile",)
    target_args = ("--target", str(target), *no_compile)
    return _pip("install", *target_args, *map(str, sources))


def run_git(repo: Path | None, *args: str, env=None, input=None):
    """``git -C repo args`` (no ``-C`` where ``repo`` is None, e.g. ``git
    apply --numstat`` of a file), ``input`` on its stdin, with ``env``
    (None: this process's).

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.
    """
    where = () if repo is None else ("-C", str(repo))
    return run(["git", *where, *args], env=env, input=input)


def git(repo: Path | None, *args: str, env=None, check=True) -> str:
    """``run_git``'s standard output.

    Raises:
        ForkError: git failed (with ``check``), its command and output.
    """
    proc = run_git(repo, *args, env=env)
    if check and proc.returncode != 0:
        raise ForkError(
            f"git {' '.join(args)} failed in {repo or '.'}:\n"
            f"{(proc.stdout + proc.stderr).strip()}"
        )
    return proc.stdout
