"""Writing outputs whole or not at all (hard rule 3: nothing
half-written)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from keras_fork.errors import ForkError


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def print_table(title: str, columns, rows, console=None) -> None:
    """Prints ``rows`` under ``title`` as a rich table.

    Args:
        title: the table's title.
        columns: a name each, or ``(name, justify)`` (``"right"``...).
        rows: sequences of ``len(columns)`` strings (rich markup read).
        console: where to print (default: stdout, no highlighting).
    """
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        name, justify = (col, "left") if isinstance(col, str) else col
        table.add_column(name, justify=justify)
    for row in rows:
        table.add_row(*row)
    (console or Console(highlight=False)).print(table)


def replace_dir(staged: Path, dest: Path) -> None:
    """Moves the folder ``staged`` to ``dest``, replacing the folder there.

    ``staged`` must be on ``dest``'s file system (renames, no copy): the old
    folder is renamed aside, the new one renamed into place, then the old
    one removed, so ``dest`` is at every moment the old folder or the new
    one, whole.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    aside = dest.with_name(f".{dest.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    if dest.exists():
        dest.rename(aside)
    staged.rename(dest)
    shutil.rmtree(aside, ignore_errors=True)


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
