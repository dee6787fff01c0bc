"""The pip runs of the tool, all with one set of options.

Every pip run uses this interpreter's pip (``python -m pip``), quietly,
without its version check, installs or downloads no dependency, and
builds nothing in an isolated environment (the pinned stack is already
installed; the tool never reaches for another).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
