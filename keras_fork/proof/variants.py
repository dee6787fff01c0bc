"""Stock and fork keras of a base, installed side by side, and the
environment of a process that imports one of them.

``stock`` is the verified upstream sdist and ``fork`` the built wheel, each
``pip install --no-deps --target build/variants/<V>/<variant>`` over the
one virtual environment, so the two differ in keras only. A cell whose
scenario needs other fixes first (``fix.toml``'s ``[prerequisites]``) runs
its stock side on ``stock+<fix>...``: the sdist plus exactly those fixes'
patches (``install_prerequisites``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.recipe import patchfile
from keras_fork.recipe import pins
from keras_fork.recipe import sdist as sdist_lib
from keras_fork.recipe import series
from keras_fork.recipe import wheel

VARIANTS = ("stock", "fork")
# Seconds a process waits for another's install of the same variant folder:
# one pip install of a keras sdist or wheel takes well under a minute here.
INSTALL_LOCK_TIMEOUT_S = 600.0
# The file in a variant folder holding the sha256 of what was installed.
STAMP = ".source-sha256"


def install_variants(layout: pins.Layout, base: pins.Base) -> dict[str, Path]:
    """(Re)installs ``stock`` and ``fork`` keras of ``base`` side by side.

    Stock comes from the verified sdist, fork from the built wheel, both with
    ``pip install --no-deps --target`` so they share every other dependency.

    Raises:
        ForkError: the fork wheel is missing (run ``scripts/build``).
    """
    whl = layout.dist / base.wheel_name
    if not whl.is_file():
        raise ForkError(f"{whl} not found: run scripts/build first")
    sources = {
        "stock": sdist_lib.fetch(layout, base),
        "fork": whl,
    }
    return {
        variant: pip_install_target(
            layout.variant(base.version, variant),
            [str(source)],
            sdist_lib.sha256_of(source),
            f"{variant} keras {base.version}",
        )
        for variant, source in sources.items()
    }


class PrerequisiteError(ForkError):
    """A cell's stock side with prerequisites cannot be built: the cell is
    ``n/a`` for that reason (``prove.with_prerequisites``)."""


def build_subset(
    layout: pins.Layout,
    base: pins.Base,
    patches,
    tmp: Path,
    source_only: bool = False,
):
    """Materializes ``patches`` (some of ``base``'s series, in its order) in
    a scratch layout under ``tmp`` and builds their wheel.

    Args:
        source_only: leave out the patches' test files (``*_test.py``): a
            patch's test hunks may need an earlier patch's, while the wheel
            holds the source alone.

    Returns:
        ``(tree, wheel)``.

    Raises:
        ForkError: a patch does not apply without the others (its name and
            file), or the wheel does not build.
    """
    scratch, tree = materialize_subset(layout, base, patches, tmp, source_only)
    return tree, wheel.build(scratch, base, tree)


def materialize_subset(layout, base, patches, tmp: Path, source_only: bool):
    """``(scratch layout, tree)`` of ``patches`` applied to the pristine
    sdist of ``base``, under ``tmp`` (see ``build_subset``).

    Raises:
        ForkError: a patch does not apply without the others.
    """
    scratch = scratch_layout(layout, base, patches, tmp, source_only)
    return scratch, series.materialize(scratch, base)


def scratch_layout(layout, base, patches, tmp: Path, source_only: bool):
    """A layout under ``tmp`` (created here) whose series of ``base`` is
    ``patches``, with their test files left out when ``source_only`` (see
    ``build_subset``); its sdist cache is ``layout``'s."""
    tmp.mkdir(parents=True)
    scratch = dataclasses.replace(
        layout, patches=tmp / "patches", build=tmp / "build", dist=tmp / "dist"
    )
    folder = series.series_dir(scratch, base)
    folder.mkdir(parents=True)
    for p in patches:
        data = p.read_bytes()
        if source_only:
            data = patchfile.without_files(data, _test_files(data))
        (folder / p.name).write_bytes(data)
    (folder / series.ORDER_FILE).write_text(
        "".join(p.name + "\n" for p in patches)
    )
    return scratch


def _test_files(patch: bytes) -> list[str]:
    """The ``*_test.py`` files a ``git format-patch`` file changes."""
    return re.findall(
        r"(?m)^diff --git a/(\S+_test\.py) b/", patch.decode(errors="replace")
    )


def prerequisite_patches(
    layout: pins.Layout, base: pins.Base, needs, fix: str
) -> list[Path]:
    """The patches of ``base``'s series that carry the fixes ``needs``, in
    series order: the stock side of a cell of ``fix`` with those
    prerequisites.

    Raises:
        PrerequisiteError: a prerequisite has no patch on ``base``, or one
            of the patches also carries ``fix`` (stock plus the
            prerequisites would then carry the fix itself).
    """
    infos = {
        p: patchfile.parse_patch(p) for p in series.read_series(layout, base)
    }
    chosen = {p: i for p, i in infos.items() if set(i.fixes) & set(needs)}
    absent = sorted(set(needs) - {f for i in chosen.values() for f in i.fixes})
    if absent:
        raise PrerequisiteError(
            f"prerequisite {', '.join(absent)} has no patch in the "
            f"{base.version} series"
        )
    shared = [i.name for i in chosen.values() if fix in i.fixes]
    if shared:
        raise PrerequisiteError(
            f"the prerequisites' patch {shared[0]} also carries {fix} on "
            f"{base.version}: stock plus the prerequisites would be the fix"
        )
    return list(chosen)


def install_prerequisites(
    layout: pins.Layout, base: pins.Base, needs, patches: list[Path]
) -> Path:
    """Installs stock plus ``patches`` (``prerequisite_patches``; their
    source, test files left out) as the variant ``stock+<need>+...`` of
    ``base``, unless already there (a stamp holds the sha256 of the sdist's
    pin, the fork version the wheel reports, and the patches).

    Returns:
        The variant's ``--target`` folder.

    Raises:
        PrerequisiteError: the patches do not apply alone on the pristine
            sdist.
        ForkError: the build or the install failed.
    """
    side = "+".join(("stock", *needs))
    dest = layout.variant(base.version, side)
    # The wheel reports the fork's version (checked by the harness), so a
    # new fork build number is a new install even with the same patches.
    h = hashlib.sha256(f"{base.sdist_sha256} {base.fork_version}".encode())
    for patch in patches:
        h.update(patch.read_bytes())
    digest = h.hexdigest()
    if _stamp_matches(dest / STAMP, digest):
        return dest
    layout.build.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=layout.build, prefix=".pre.") as t:
        try:
            scratch, tree = materialize_subset(
                layout, base, patches, Path(t) / "subset", source_only=True
            )
        except ForkError as e:
            raise PrerequisiteError(
                f"without the rest of the series, {e}"
            ) from None
        whl = wheel.build(scratch, base, tree)
        what = f"{side} keras {base.version}"
        return pip_install_target(dest, [str(whl)], digest, what)


def child_env(
    keras_dir: Path,
    overlay: Path | None = None,
    topology_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a child process that imports one keras variant.

    One rule for the proof cells (``runner.run_variant``), the benchmarks
    (``counts.run_worker``, ``lockstep.run``), the bisection
    (``bisect.prepare_prefix``) and ``regressions``, so that they see the
    same keras, overlay and devices. Starting from this process's
    environment:

    1. ``PROOF_*`` variables are dropped: they are the settings of one cell
       (``run_variant`` adds the child's own afterwards).
    2. ``XLA_FLAGS`` is dropped: a topology sets its own device count, and
       jax reads ``XLA_FLAGS`` once, when its backend starts, so it must be
       right in the child's initial environment
       (https://docs.jax.dev/en/latest/xla_flags.html).
    3. ``topology_env`` is added over it.
    4. ``PYTHONPATH`` is replaced by ``keras_dir``, ``overlay``, the
       repository root, in that order. ``PYTHONPATH`` entries come before
       site-packages on ``sys.path``
       (https://docs.python.org/3/using/cmdline.html#envvar-PYTHONPATH),
       so this keras shadows any installed one and the overlay shadows the
       virtual environment's packages.

    Args:
        keras_dir: where the keras variant is installed (a ``pip --target``
            folder).
        overlay: the base's test overlay (see ``install_overlay``), or
            ``None`` for none.
        topology_env: variables to set, e.g. ``topologies.env_for(...)``
            (backend, devices); ``None`` for none.

    Returns:
        A new dict, for ``subprocess``'s ``env``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOF_")}
    env.pop("XLA_FLAGS", None)
    env.update(topology_env or {})
    paths = [keras_dir, overlay, pins.CODE_ROOT]
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths if p)
    return env


def compile_cache_env(layout: pins.Layout) -> dict[str, str]:
    """The environment that shares JAX's persistent compilation cache
    between the test processes of a run (proof cells, bisection).

    A Keras test builds a fresh model, so a fresh jitted step, for every
    case: the in-memory jit cache misses and XLA compiles the same program
    again, in the same process and in the next one (stock and fork
    variants, the next topology). The persistent cache is keyed by the
    program's HLO, the compile options and the jax and XLA versions, so
    only an identical program is reused
    (https://docs.jax.dev/en/latest/persistent_compilation_cache.html);
    both thresholds are 0 because a CPU compile of a small test model takes
    under the default 1 s. Benchmarks do not use it: a stock-vs-fork time
    would then depend on which variant ran first.

    Returns:
        ``{"JAX_COMPILATION_CACHE_DIR": "<build>/jax-cache", ...}``.
    """
    return {
        "JAX_COMPILATION_CACHE_DIR": str(layout.build / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


def install_overlay(layout: pins.Layout, base: pins.Base) -> Path | None:
    """Installs ``base.test_overlay`` (e.g. an older jax) for its cells.

    The pins go, without their dependencies, into
    ``build/variants/<V>/overlay``, which the cells of that base put on
    ``PYTHONPATH`` after keras and before the venv, so they shadow the
    venv's newer versions of the same projects.

    Returns:
        The folder, or None when the base declares no overlay.

    Raises:
        ForkError: pip could not install a pin.
    """
    if not base.test_overlay:
        return None
    pins_text = "\n".join(sorted(base.test_overlay))
    return pip_install_target(
        layout.variant(base.version, "overlay"),
        list(base.test_overlay),
        hashlib.sha256(pins_text.encode()).hexdigest(),
        f"test overlay of {base.version}",
    )


def pip_install_target(
    dest: Path,
    sources: list[str],
    digest: str,
    what: str,
    lock_timeout: float = INSTALL_LOCK_TIMEOUT_S,
) -> Path:
    """``pip install --no-deps --target dest`` unless already there.

    A stamp file holds ``digest`` (of what was installed); the install goes
    to a temporary sibling that replaces ``dest`` only when complete.

    Processes that install the same ``dest`` at once (the two ``-n 2``
    workers of the release checks on a clean checkout) take turns on a lock
    file beside it, and each reads the stamp again once it holds the lock.
    Without the lock the second install would delete the first one's folder
    while a child process of the first was importing keras from it.

    Args:
        dest: the ``--target`` folder.
        sources: what to install (paths or requirement strings).
        digest: sha256 (hex) of the sources, stored in the stamp.
        what: the words that name the install in an error.
        lock_timeout: seconds to wait for another process's install of the
            same ``dest``.

    Returns:
        ``dest``.

    Raises:
        ForkError: pip failed, or another process held the lock for longer
            than ``lock_timeout`` seconds.
    """
    stamp = dest / STAMP
    if _stamp_matches(stamp, digest):
        return dest
    import filelock  # requirements/test.txt: only an install needs it

    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = dest.parent / f".{dest.name}.lock"
    try:
        with filelock.FileLock(lock, timeout=lock_timeout):
            if not _stamp_matches(stamp, digest):
                _install_into(dest, sources, digest, what)
    except filelock.Timeout:  # raised only while acquiring the lock
        raise ForkError(
            f"installing {what}: another process held {lock} for "
            f"more than {lock_timeout:.0f} s"
        ) from None
    return dest


def _stamp_matches(stamp: Path, digest: str) -> bool:
    return stamp.is_file() and stamp.read_text() == digest


def _install_into(dest: Path, sources: list[str], digest: str, what: str):
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        proc = process.pip_install(sources, tmp)
        if proc.returncode != 0:
            raise ForkError(f"installing {what} failed:\n{proc.stderr[-2000:]}")
        (tmp / STAMP).write_text(digest)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
