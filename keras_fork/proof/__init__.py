"""The proof: stock vs fork, per base x fix x backend x topology.

* ``fixes``: the fix catalog (``integration_tests/fixes/<id>/fix.toml``)
  and its matrix cells;
* ``variants``: stock and fork keras installed side by side, and the
  environment of a process that imports one;
* ``runner``: one pytest run of one variant of one cell, and its JUnit;
* ``prove``: the matrix (``python -m keras_fork prove``);
* ``bisect``: every shorter prefix of a series builds and passes its tests.
"""
