"""Distributed equals one device, feature by feature.

Each case runs one feature (``features.FEATURES``) under this process's
topology (``PROOF_TOPOLOGY``) and on one device, on the same global
batches, and passes where every result agrees (``cells.run_cell``). Its
cell is written to ``EQUIVALENCE_OUT`` where set (``python -m keras_fork
equivalence`` collects them into the table, ``docs/equivalence.md``).
"""

import pytest

from . import cells
from . import features

pytestmark = pytest.mark.equivalence


@pytest.mark.parametrize("name", sorted(features.FEATURES))
def test_feature_equals_one_device(topology, name, tmp_path):
    """Feature ``name`` under the topology equals one device."""
    cell = cells.run_cell(name, topology, tmp_path)
    cells.record(cell)
    if cell.verdict == "n/a":
        pytest.skip(f"n/a: {cell.detail}")
    assert cell.verdict == "equal", f"{cell.verdict}: {cell.detail}"
