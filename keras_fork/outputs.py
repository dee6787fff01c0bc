"""Writing outputs whole or not at all (hard rule 3: nothing
half-written)."""

from __future__ import annotations

import os
from pathlib import Path

from keras_fork.errors import ForkError


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def replace_between(path: Path, begin: str, end: str, body: str) -> None:
    """Replaces the text between the marker lines ``begin`` and ``end`` of
    ``path`` (e.g. the README's proof table), atomically.

    Raises:
        ForkError: a marker is missing.
    """
    text = path.read_text()
    head, sep1, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not (sep1 and sep2):
        raise ForkError(f"{path} lacks the {begin} ... {end} markers")
    write_atomic(path, head + begin + "\n" + body + end + tail)
