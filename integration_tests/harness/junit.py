"""What a pytest run's JUnit (xunit1) file says, read in one pass."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class JUnitResult:
    """A JUnit file's suite counts and cases.

    ``counts``: the suite's tests, failures, errors and skipped (empty when
    the file is missing or unreadable); ``cases``: for each test case its
    name, classname, file (as pytest reports it, relative to the rootdir),
    outcome
    (passed/failure/error/skipped), role (``proof`` unless the test's
    ``role`` property says otherwise), fix (its ``fix`` property, or
    None), time (seconds, setup and teardown included) and text (the first
    line of its failure or error message, or ""), skip (the first line
    of its skip reason, or ""); ``first_failure``:
    "name: first message line" of the first failed or erroring case, or "".
    """

    counts: dict
    cases: list
    first_failure: str


def read_junit(path: Path) -> JUnitResult:
    """Parses ``path`` once; see ``JUnitResult``."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return JUnitResult({}, [], "")
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {}
    if suite is not None:
        keys = ("tests", "failures", "errors", "skipped")
        counts = {k: int(suite.get(k, 0)) for k in keys}
    cases = [_case(node) for node in root.iter("testcase")]
    first_failure = next(
        (f"{c['name']}: {c['text']}"[:300] for c in cases if c["text"]), ""
    )
    return JUnitResult(counts, cases, first_failure)


def _case(node) -> dict:
    outcome, text, skip = "passed", "", ""
    for tag in ("failure", "error", "skipped"):
        found = node.find(tag)
        if found is None:
            continue
        outcome = tag
        lines = (found.get("message") or "").splitlines()
        first = next((ln.strip() for ln in lines if ln.strip()), tag)
        if tag == "skipped":
            skip = first
        else:
            text = first
        break
    props = {p.get("name"): p.get("value") for p in node.iter("property")}
    return {
        "name": node.get("name"),
        "classname": node.get("classname") or "",
        "file": node.get("file") or "",
        "outcome": outcome,
        "role": props.get("role", "proof"),
        "fix": props.get("fix"),
        "time": float(node.get("time") or 0),
        "text": text,
        "skip": skip,
    }
