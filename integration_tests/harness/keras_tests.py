"""The pytest plugin of every run of Keras's own test files from an sdist.

Loaded with ``-p`` (``selection.KERAS_TESTS_PLUGIN``) by the proof matrix's
``unit`` cells (``keras_fork.proof.runner``), each prefix of the bisection
(``keras_fork.proof.bisect``) and ``regressions``: Keras's repository
``conftest.py`` is not in the sdist. Its rules, as Keras's:

* torch is imported before TensorFlow;
* the ``requires_trainable_backend`` and ``multi_device`` markers are
  declared, and a ``multi_device`` test is skipped unless the backend sees
  several devices (``selection.skip_multi_device``).

The proof runs' own:

* the check that the run imported the keras it was started for
  (``plugin.pytest_configure``: ``PROOF_KERAS_DIR``,
  ``PROOF_KERAS_VERSION``; neither set, nothing is checked);
* the tests a patch adds, selected by exact name
  (``selection.added_tests_env``): ``PROOF_UNIT_TESTS`` (a JSON list of
  test function names, ``selection.is_added_test``) keeps only those, in
  every file or, where ``PROOF_UNIT_ADDED_ONLY`` (a JSON list of file
  names) is set, in those files only; unset, every test runs.
"""

import json
import os

try:
    import torch  # noqa: F401  (before TensorFlow, as Keras's conftest)
except ImportError:
    torch = None

from . import plugin
from .selection import ADDED_ONLY_ENV
from .selection import ADDED_TESTS_ENV
from .selection import is_added_test
from .selection import skip_multi_device

KERAS_MARKERS = (
    "requires_trainable_backend: needs a backend that can train",
    "multi_device: needs several devices",
)


def pytest_configure(config):
    for line in KERAS_MARKERS:
        config.addinivalue_line("markers", line)
    plugin.pytest_configure(config)


def pytest_collection_modifyitems(config, items):
    skip_multi_device(items)
    names = os.environ.get(ADDED_TESTS_ENV)
    if names is None:
        return
    names = set(json.loads(names))
    only = os.environ.get(ADDED_ONLY_ENV)
    only = None if only is None else set(json.loads(only))
    keep = [
        i
        for i in items
        if (only is not None and i.path.name not in only)
        or is_added_test(i.name, names)
    ]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep
