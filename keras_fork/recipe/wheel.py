"""The fork wheel: a drop-in ``keras`` built from the materialized tree.

* distribution name ``keras``, version ``<base>+fork.<N>`` (PEP 440 local
  label: ``keras==<base>`` and ``~=``/``==X.Y.*`` accept it);
* built by the standard ``build`` frontend (setuptools backend of upstream's
  own ``pyproject.toml``), without build isolation, from the pinned
  constraints;
* reproducible: SOURCE_DATE_EPOCH is the upstream release time and the umask
  is 022, so two builds from the same inputs are byte-identical;
* carries ``FORK_PATCHES.json`` in its ``.dist-info``, readable with
  ``importlib.metadata.distribution("keras").read_text("FORK_PATCHES.json")``,
  and its own entry of ``CHANGELOG.md`` as ``FORK_CHANGELOG.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.recipe import patchfile
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe import series
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout

MANIFEST = "FORK_PATCHES.json"
CHANGELOG = "CHANGELOG.md"
CHANGELOG_ENTRY = "FORK_CHANGELOG.md"
VERSION_FILE = "keras/src/version.py"


def _run(cmd: list[str], what: str, env=None, cwd=None) -> None:
    proc = process.run(cmd, env=env, cwd=cwd)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise ForkError(f"{what} failed:\n{tail}")


@contextlib.contextmanager
def reproducible_build(layout: Layout, prefix: str, epoch: int):
    """A scratch folder under ``build/`` (on ``dist/``'s file system, so
    a finished wheel is renamed into place atomically) and the
    environment of a reproducible build: ``SOURCE_DATE_EPOCH`` is
    ``epoch`` and the umask 022 while it lasts.

    Yields:
        ``(folder, environment)``.
    """
    layout.build.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    old_umask = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(dir=layout.build, prefix=prefix) as t:
            yield Path(t), env
    finally:
        os.umask(old_umask)


def build_frontend(src: Path, outdir: Path, what: str, env) -> Path:
    """Builds the wheel of the project in ``src`` into ``outdir`` with the
    standard ``build`` frontend, without build isolation.

    Returns:
        The wheel.

    Raises:
        ForkError: the frontend failed (``what`` names the build).
    """
    cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation"]
    _run(cmd + ["--outdir", str(outdir), str(src)], what, env=env)
    (built,) = outdir.glob("*.whl")
    return built


def _stage(tree: Path, dest: Path, base: Base) -> None:
    """Exports HEAD of ``tree`` into ``dest`` with the fork version set."""
    archive = dest.parent / "tree.tar"
    series.git(
        tree,
        "-c",
        "tar.umask=0022",
        "archive",
        "--format=tar",
        "-o",
        str(archive),
        "HEAD",
    )
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    version_py = dest / VERSION_FILE
    text = version_py.read_text()
    pattern = rf'^__version__ = "{re.escape(base.version)}"$'
    new, n = re.subn(
        pattern, f'__version__ = "{base.fork_version}"', text, flags=re.M
    )
    if n != 1:
        raise ForkError(
            f"{VERSION_FILE} of base {base.version} does not hold exactly one "
            f'`__version__ = "{base.version}"` line; cannot set the fork label'
        )
    version_py.write_text(new)
    if base.package != "keras":
        _rename_project(dest / "pyproject.toml", base)
    # sdist artifacts: setuptools regenerates them from pyproject.toml.
    (dest / "PKG-INFO").unlink(missing_ok=True)
    for egg in dest.glob("*.egg-info"):
        shutil.rmtree(egg)


def _rename_project(pyproject: Path, base: Base) -> None:
    """Names the distribution ``keras`` in ``pyproject`` (a nightly's says
    ``keras-nightly``), so that the fork wheel is a drop-in ``keras``.

    Raises:
        ForkError: ``pyproject`` has not exactly one ``name = "<package>"``
            line.
    """
    text = pyproject.read_text()
    pattern = rf'^name = "{re.escape(base.package)}"$'
    new, n = re.subn(pattern, 'name = "keras"', text, flags=re.M)
    if n != 1:
        raise ForkError(
            f"pyproject.toml of base {base.version} does not hold exactly "
            f'one `name = "{base.package}"` line; cannot name the wheel keras'
        )
    pyproject.write_text(new)


def patch_manifest(layout: Layout, base: Base) -> list[dict]:
    """The ``patches`` list of ``FORK_PATCHES.json``: each patch's subject,
    fix id, upstream issue and DEP-3 trailers, in series order. ``name`` is
    the patch's file name in the PR series (``git format-patch``'s, without
    the number, ``patchfile.format_patch_name``): a reader can match it
    against a PR, and it does not change when ``patches/<V>/`` renames a
    file.

    Raises:
        ForkError: the series cannot be read.
    """
    out = []
    for path in series.read_series(layout, base):
        info = patchfile.parse_patch(path)
        name = patchfile.format_patch_name(info.subject)
        out.append(dict(info.manifest_entry(), name=name))
    return out


def _build_unpacked(tree: Path, tmp: Path, base: Base, env) -> None:
    """Stages ``tree`` in ``tmp/src``, builds its wheel into ``tmp/built``
    with the ``build`` frontend and unpacks it into ``tmp/unpacked``."""
    stage = tmp / "src"
    _stage(tree, stage, base)
    what = f"building the wheel of base {base.version}"
    built = build_frontend(stage, tmp / "built", what, env)
    _run(
        [
            sys.executable,
            "-m",
            "wheel",
            "unpack",
            "-d",
            str(tmp / "unpacked"),
            str(built),
        ],
        "unpacking the wheel",
        env=env,
    )


def changelog_entry(layout: Layout, base: Base) -> str | None:
    """The entry of ``base``'s wheel in ``CHANGELOG.md``: the ``## `` section
    whose heading names its version (``3.15.1+fork.22``; one heading may
    name the versions of several bases), heading included.

    Returns:
        The entry's text, or None where the layout has no ``CHANGELOG.md``
        (a test's fake upstream).

    Raises:
        ForkError: ``CHANGELOG.md`` has no entry for the version (every
            wheel version has one, docs/adding-a-fix.md).
    """
    path = layout.root / CHANGELOG
    if not path.is_file():
        return None
    version = re.escape(base.fork_version)
    entry = re.search(
        rf"^## [^\n]*(?<![\w.+]){version}(?![\w.+])[^\n]*\n.*?(?=^## |\Z)",
        path.read_text(),
        flags=re.M | re.S,
    )
    if not entry:
        raise ForkError(
            f"{path.name} has no entry for {base.fork_version}: add a "
            f"'## {base.fork_version}' section saying what changed"
        )
    return entry[0].rstrip() + "\n"


def _add_manifest(
    tmp: Path, base: Base, manifest: list, entry: str | None, env
) -> None:
    """Writes ``FORK_PATCHES.json`` (and the wheel's changelog ``entry``)
    into the unpacked wheel under ``tmp/unpacked`` and packs it again into
    ``tmp/packed``."""
    (root,) = (tmp / "unpacked").iterdir()
    (info,) = root.glob("*.dist-info")
    if entry is not None:
        (info / CHANGELOG_ENTRY).write_text(entry)
    (info / MANIFEST).write_text(
        json.dumps(
            {
                "base": base.version,
                "version": base.fork_version,
                "patches": manifest,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    (tmp / "packed").mkdir()
    _run(
        [
            sys.executable,
            "-m",
            "wheel",
            "pack",
            "-d",
            str(tmp / "packed"),
            str(root),
        ],
        "repacking the wheel",
        env=env,
    )


def build(
    layout: Layout, base: Base, tree: Path, outdir: Path | None = None
) -> Path:
    """Builds ``keras-<base>+fork.<N>-py3-none-any.whl`` from ``tree`` into
    ``outdir`` (default ``dist/``).

    The wheel is built under ``build/`` and renamed into ``outdir``, so
    ``outdir`` never holds a partial wheel.

    Returns:
        The wheel's path.

    Raises:
        ForkError: the build frontend, or the manifest step, failed;
            ``CHANGELOG.md`` has no entry for the wheel's version.
    """
    epoch = sdist_lib.source_date_epoch(layout.cache / base.sdist_name, base)
    manifest = patch_manifest(layout, base)
    entry = changelog_entry(layout, base)
    layout.dist.mkdir(parents=True, exist_ok=True)
    with reproducible_build(layout, ".wheel.", epoch) as (tmp, env):
        _build_unpacked(tree, tmp, base, env)
        _add_manifest(tmp, base, manifest, entry, env)
        (packed,) = (tmp / "packed").glob("*.whl")
        if packed.name != base.wheel_name:
            raise ForkError(f"built {packed.name}, expected {base.wheel_name}")
        # Same file system as dist/ (both in the checkout): the rename is
        # atomic, dist/ never sees a partial wheel.
        final = (outdir or layout.dist) / base.wheel_name
        os.replace(packed, final)
    return final
