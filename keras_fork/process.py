"""The git and pip runs of the tool.

``run_git`` runs git and returns what it did, for the callers that read a
failure (e.g. a patch that does not apply); ``git`` returns its output and
raises on failure. Every pip run uses this interpreter's pip (``python -m
pip``), quietly, without its version check, installs or downloads no
dependency, and builds nothing in an isolated environment (the pinned stack
is already installed; the tool never reaches for another).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from keras_fork.errors import ForkError

_PIP = (sys.executable, "-m", "pip")
# Every run: quiet, no version check, no dependency, no isolated build.
_OPTIONS = (
    "-q",
    "--disable-pip-version-check",
    "--no-deps",
    "--no-build-isolation",
)


def _pip(command: str, *args: str):
    return subprocess.run(
        [*_PIP, command, *_OPTIONS, *args], capture_output=True, text=True
    )


def pip_download_sdist(requirement: str, dest: Path):
    """Downloads the sdist of ``requirement`` (never a wheel) into ``dest``.

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.
    """
    return _pip(
        "download", "--no-binary", ":all:", "-d", str(dest), requirement
    )


def pip_install(sources: list, target: Path):
    """Installs ``sources`` (wheels, sdists or folders) into the folder
    ``target`` (``pip install --target``), to be put first on a child
    process's ``PYTHONPATH``.

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.
    """
    return _pip("install", "--target", str(target), *map(str, sources))


def run_git(repo: Path | None, *args: str, env=None, input=None):
    """``git -C repo args`` (no ``-C`` where ``repo`` is None, e.g. ``git
    apply --numstat`` of a file), ``input`` on its stdin, with ``env``
    (None: this process's).

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.
    """
    where = () if repo is None else ("-C", str(repo))
    return subprocess.run(
        ["git", *where, *args],
        capture_output=True,
        text=True,
        env=env,
        input=input,
    )


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
