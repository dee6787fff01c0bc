"""The pip runs of the tool: one argument list for each kind.

Every pip run uses this interpreter's pip (``python -m pip``), quietly,
without its version check, installs or downloads no dependency, and
builds nothing in an isolated environment (the pinned stack is already
installed; the tool never reaches for another).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_PIP = (
    sys.executable,
    "-m",
    "pip",
)
_OPTIONS = ("-q", "--disable-pip-version-check", "--no-deps")


def pip_download_sdist(requirement: str, dest: Path):
    """Downloads the sdist of ``requirement`` (never a wheel) into ``dest``.

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.
    """
    return subprocess.run(
        [
            *_PIP,
            "download",
            *_OPTIONS,
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "-d",
            str(dest),
            requirement,
        ],
        capture_output=True,
        text=True,
    )


def pip_install(sources: list, target: Path):
    """Installs ``sources`` (wheels, sdists or folders) into the folder
    ``target`` (``pip install --target``), to be put first on a child
    process's ``PYTHONPATH``.

    Returns:
        The ``subprocess.CompletedProcess``, its output captured as text,
        whatever its exit status: the caller says what failed.
    """
    return subprocess.run(
        [
            *_PIP,
            "install",
            *_OPTIONS,
            "--no-build-isolation",
            "--target",
            str(target),
            *map(str, sources),
        ],
        capture_output=True,
        text=True,
    )
