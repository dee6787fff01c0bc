"""Imported last by the workers' fork server (``workers._fork_server_for``),
after keras and its backend: freezes the server's heap, so that the workers
forked from it inherit a frozen heap.

Python's garbage collector writes to every object it walks; in a forked
worker that copies each page of the inherited heap on the first collection
(copy-on-write), and every full collection walks the backend's modules
again. Frozen objects are skipped by both (``gc.freeze``:
https://docs.python.org/3/library/gc.html#gc.freeze, "to avoid
copy-on-write ... call gc.freeze() in the parent process" before forking).
``PROOF_GC_FREEZE=0`` leaves the heap unfrozen (``plugin.freeze_heap``).
"""

import gc

from integration_tests.harness import plugin

gc.collect()
plugin.freeze_heap()
