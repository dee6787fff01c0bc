"""The pristine upstream source: download, sha256 check, unpack.

Follows the conda-forge recipe rule: the sdist is pinned by sha256 and checked
before anything is unpacked.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

from keras_fork import process
from keras_fork.errors import ForkError
from keras_fork.recipe import pins
from keras_fork.recipe.pins import Base
from keras_fork.recipe.pins import Layout

GIVEN = "the given sdist"
CACHED = "the cached sdist"
DOWNLOADED = "the downloaded sdist"
# What to do about a file that is not the pinned sdist, by where it came
# from: a file the user passed in is theirs, the cache is the project's.
_REMEDIES = {
    GIVEN: "Pass the genuine {name} from PyPI, or leave out --sdist to "
    "download it.",
    CACHED: "Delete that file (the project's own cache) and run again to "
    "download it anew.",
    DOWNLOADED: "The package index served another file than the pin in "
    "keras_fork/bases.toml: check the pin.",
}


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _top_folder(path: Path) -> str | None:
    """The top folder of a ``.tar.gz`` (its first member's first part), or
    None where the file is no readable gzip'd tar archive."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            first = tar.next()
    except (tarfile.TarError, EOFError, OSError, zlib.error):
        return None
    return first.name.split("/")[0] if first else None


def _check(base: Base, path: Path, origin: str) -> None:
    """Raises unless ``path`` is ``base``'s sdist, byte for byte.

    The message tells the cases apart: another project's or version's sdist
    (its top folder names it), or a corrupt or modified file. Only the
    project's own cache is ever named for deletion; a file the user passed
    in (``--sdist``) is theirs.

    Raises:
        ForkError: the sha256 differs from the pin.
    """
    actual = sha256_of(path)
    if actual == base.sdist_sha256:
        return
    top = _top_folder(path)
    if top and top != base.sdist_stem:
        what = (
            f"{origin} {path} is the sdist of {top}, not of "
            f"{base.requirement} (its top folder is {top}/, expected "
            f"{base.sdist_stem}/)."
        )
    else:
        kind = "not a readable .tar.gz" if top is None else "modified"
        what = (
            f"{origin} {path} is corrupt ({kind}): sha256 {actual}, "
            f"expected {base.sdist_sha256} for {base.requirement}."
        )
    remedy = _REMEDIES[origin].format(name=base.sdist_name)
    raise ForkError(f"{what} Nothing was unpacked or changed. {remedy}")


def _pip_download(base: Base, dest: Path) -> Path:
    proc = process.pip_download_sdist(base.requirement, dest)
    found = dest / base.sdist_name
    if proc.returncode != 0 or not found.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
        raise ForkError(
            f"could not download {base.requirement} from the package index "
            f"and no cached sdist exists.\npip said:\n{tail}\n"
            f"Without network, pass the sdist with --sdist PATH "
            f"({base.sdist_name}, sha256 {base.sdist_sha256})."
        )
    return found


def fetch_selected(
    layout: Layout, names: list[str] | None, sdist: Path | None = None
) -> list[Base]:
    """The pinned bases ``names`` selects (``pins.select_bases``; None:
    every one), each's sdist fetched and verified (``fetch``) before the
    caller writes anything.

    Args:
        sdist: an sdist file to use instead of the cached one, for exactly
            one base.

    Raises:
        ForkError: an unknown base, ``sdist`` with several bases, or what
            ``fetch`` raises.
    """
    bases = pins.select_bases(layout, names)
    if sdist and len(bases) != 1:
        raise ForkError("--sdist needs exactly one --base")
    for base in bases:
        fetch(layout, base, sdist)
    return bases


def fetch(layout: Layout, base: Base, sdist: Path | None = None) -> Path:
    """Returns the verified sdist of ``base`` in the cache.

    Args:
        layout: where the cache is (``layout.cache``).
        base: the pinned base.
        sdist: an sdist file to use instead of downloading (offline builds).

    Returns:
        The path ``<cache>/<sdist_name>``, whose sha256 matches.

    Raises:
        ForkError: hash mismatch (expected and actual are named; nothing is
            unpacked and a bad file is never moved into the cache), or no
            network and nothing cached.
    """
    layout.cache.mkdir(parents=True, exist_ok=True)
    cached = layout.cache / base.sdist_name
    if sdist is not None:
        sdist = Path(sdist)
        if not sdist.exists():
            raise ForkError(
                f"--sdist {sdist}: no such file. Pass the path of "
                f"{base.sdist_name}, or leave out --sdist to download it."
            )
        if not sdist.is_file():
            raise ForkError(f"--sdist {sdist}: not a file")
        _check(base, sdist, GIVEN)
        if sdist.resolve() != cached.resolve():
            tmp = cached.with_suffix(".partial")
            shutil.copyfile(sdist, tmp)
            tmp.replace(cached)
        return cached
    if cached.is_file():
        _check(base, cached, CACHED)
        return cached
    with tempfile.TemporaryDirectory(dir=layout.cache) as tmp:
        found = _pip_download(base, Path(tmp))
        _check(base, found, DOWNLOADED)
        found.replace(cached)
    return cached


def source_date_epoch(path: Path, base: Base) -> int:
    """The upstream release time: mtime (s since epoch) of the sdist's
    PKG-INFO. Used as SOURCE_DATE_EPOCH and as git dates, so that trees and
    wheels are reproducible."""
    with tarfile.open(path, "r:gz") as tar:
        return int(tar.getmember(f"{base.sdist_stem}/PKG-INFO").mtime)


def unpack(path: Path, base: Base, dest: Path) -> None:
    """Unpacks the sdist's top folder (``base.sdist_stem``) into ``dest``.

    ``dest`` must not exist; it is created. Members are filtered with
    tarfile's ``data`` filter (no absolute paths, links out of the tree, or
    foreign owners).

    Raises:
        ForkError: the archive does not hold ``<sdist_stem>/``.
    """
    top = base.sdist_stem
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        with tarfile.open(path, "r:gz") as tar:
            names = tar.getnames()
            if not names or any(
                n != top and not n.startswith(top + "/") for n in names
            ):
                raise ForkError(
                    f"{path} is not a {base.requirement} sdist: every member "
                    f"must live under {top}/"
                )
            tar.extractall(tmp, filter="data")
        Path(tmp, top).rename(dest)
