"""The tests wheel: the fix tests and their runner, installable with pip.

``integration_tests/`` (the harness, every fix's tests and ``fix.toml``)
is packaged as ``keras_fork_tests``, distribution ``keras-fork-tests``,
into ``dist/keras_fork_tests-<V>+c<digest>-py3-none-any.whl`` (``V``:
this tool's version, ``setup.cfg``; ``digest``: the fix catalog it holds,
``catalog_digest``). It depends on pytest, pytest-timeout and
packaging only: Keras and its backends are whatever the user has. Once
installed:

* ``python -m keras_fork_tests`` (or ``keras-fork-verify``) runs
  ``verify`` against the importable keras (``harness.verify``);
* ``pytest --pyargs keras_fork_tests`` runs the tests on the topology of
  ``PROOF_TOPOLOGY`` (default ``1``).

The package imports itself by relative imports only, so it works under
either name. The build is reproducible: ``SOURCE_DATE_EPOCH`` is fixed
and the umask 022, so two builds of one commit are byte-identical.
"""

from __future__ import annotations

import configparser
import hashlib
import os
import shutil
from pathlib import Path

from keras_fork.errors import ForkError
from keras_fork.recipe import wheel
from keras_fork.recipe.pins import CODE_ROOT
from keras_fork.recipe.pins import Layout

PACKAGE = "keras_fork_tests"
DISTRIBUTION = "keras-fork-tests"
SOURCE = "integration_tests"
# 1980-01-01, the earliest time a zip entry holds.
EPOCH = 315532800

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "{version}"
description = "Distributed-training fix tests for Keras 3: verify any keras"
license = {{text = "Apache-2.0"}}
requires-python = ">=3.11"
dependencies = ["pytest", "pytest-timeout", "packaging"]

[project.scripts]
keras-fork-verify = "{package}.harness.verify:main"

[tool.setuptools.packages.find]
include = ["{package}*"]

[tool.setuptools.package-data]
"{package}.fixes" = ["reasons.toml", "*/fix.toml"]
"""


def version() -> str:
    """This tool's version, ``[metadata] version`` of its ``setup.cfg``.

    Raises:
        ForkError: ``setup.cfg`` has none.
    """
    cfg = configparser.ConfigParser()
    cfg.read(CODE_ROOT / "setup.cfg")
    try:
        return cfg["metadata"]["version"]
    except KeyError:
        raise ForkError("setup.cfg has no [metadata] version") from None


def catalog_digest() -> str:
    """The first 12 hex digits of the sha256 over the files the wheel
    packs (``integration_tests/``: the harness, every fix's tests and
    ``fix.toml``), path and bytes, in path order: two wheels with the
    same digest hold the same fix catalog."""
    h = hashlib.sha256()
    root = CODE_ROOT / SOURCE
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def wheel_version() -> str:
    """``<V>+c<digest>``: this tool's version with the catalog's digest as
    the PEP 440 local label (``c`` first, so that an all-digit digest is
    not normalized as a number)."""
    return f"{version()}+c{catalog_digest()}"


def wheel_name() -> str:
    """``keras_fork_tests-<V>+c<digest>-py3-none-any.whl``."""
    return f"{PACKAGE}-{wheel_version()}-py3-none-any.whl"


def _stage(src: Path) -> None:
    """Copies this tool's test package (``integration_tests/`` of its own
    checkout, whatever layout it builds) into ``src/keras_fork_tests`` (no
    caches) with its ``pyproject.toml`` beside it."""
    shutil.copytree(
        CODE_ROOT / SOURCE,
        src / PACKAGE,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    (src / "pyproject.toml").write_text(
        PYPROJECT.format(
            distribution=DISTRIBUTION,
            version=wheel_version(),
            package=PACKAGE,
        )
    )


def build(layout: Layout, outdir: Path | None = None) -> Path:
    """Builds the tests wheel into ``outdir`` (default ``dist/``), through
    a folder under ``build/``: ``outdir`` never holds a partial wheel.

    Returns:
        The wheel's path.

    Raises:
        ForkError: the build frontend failed, or built another name.
    """
    with wheel.reproducible_build(layout, ".testswheel.", EPOCH) as (tmp, env):
        _stage(tmp / "src")
        what = "building the tests wheel"
        built = wheel.build_frontend(tmp / "src", tmp / "built", what, env)
        if built.name != wheel_name():
            raise ForkError(f"built {built.name}, expected {wheel_name()}")
        final = (outdir or layout.dist) / built.name
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(built, final)
    for older in final.parent.glob(f"{PACKAGE}-*.whl"):
        if older != final:  # another catalog's: one tests wheel in dist/
            older.unlink()
    return final
