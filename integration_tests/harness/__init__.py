"""The proof harness: what the proof tests and the tool share.

* ``topologies``: the table of backend/topology cells and the environment a
  process of each needs (imports no backend; the tool reads it);
* ``devices``: in-process device set-up (``current()``, strategies);
* ``workers``: N worker processes with bounded waits and group kills;
* ``data``: each process's part of the global batches, a torch DDP loop;
* ``recorders``: callbacks and fit helpers that record what a test compares;
* ``selection``: which fixes' tests a run collects, each case's fix and role;
* ``markers``: the ``topology`` marker, the topologies a test runs on
  (skipped elsewhere at collection, with the reason);
* ``plugin``: the pytest hooks that declare the markers and check which
  keras a run imported.

Layering (checked by import-linter, ``setup.cfg``): the harness imports
nothing of ``keras_fork`` nor of ``integration_tests.fixes``.
"""
