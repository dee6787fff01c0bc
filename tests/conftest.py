"""The tool's tests use the proof tests' ``fix`` and ``topology`` markers on
fake proof tests: declared by the harness, as in a proof run."""

from integration_tests.harness import markers


def pytest_configure(config):
    markers.register(config)
