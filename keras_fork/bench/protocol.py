"""The worker's side of a timed run's lockstep, and its result document.

A benchmark worker process (``keras_fork.bench.worker``) waits at its
``Gate`` before each measured repetition and reports its duration there;
it ends by printing one ``measurement``.
"""

import json
import os
import resource
import socket


def measurement(seconds, **extra):
    """The JSON document of a measurement: ``seconds`` (a list), this
    process's peak resident memory in MiB, and ``extra``."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mib": peak_kib / 1024, **extra}


# Seconds a worker waits for its next turn: the other variant's longest
# repetition (an epoch of a multi-device case) plus its start-up.
GATE_TIMEOUT = 600


class Gate:
    """The worker's side of the lockstep with ``keras_fork.bench``.

    A line protocol over a TCP connection to ``address`` (127.0.0.1 only),
    ASCII, one message a line:

    * worker: connects and sends ``{"ready": true}`` when it first waits
      (its warm-up done: a process that never waits never connects);
    * bench: ``go``, run one repetition; worker: ``{"seconds": t}``;
    * bench closes the connection when the round is over; the worker then
      exits (``close``), so that its teardown overlaps no measurement.

    A gate made with ``address=None`` (a work count, a test) lets every
    repetition run at once. Every wait is bounded by ``GATE_TIMEOUT``.
    """

    def __init__(self, address=None):
        self._address = None
        self._file = None
        if address:
            host, port = address.rsplit(":", 1)
            if host != "127.0.0.1":
                raise ValueError(f"the gate is on 127.0.0.1, not {host!r}")
            self._address = (host, int(port))

    @classmethod
    def from_env(cls):
        """The gate named by ``BENCH_GATE``, or a no-op one."""
        return cls(os.environ.get("BENCH_GATE"))

    def wait(self):
        """Blocks until the benchmark says ``go``."""
        if self._address is None:
            return
        if self._file is None:
            sock = socket.create_connection(self._address, GATE_TIMEOUT)
            self._file = sock.makefile("rw", encoding="ascii", newline="\n")
            self._send({"ready": True})
        line = self._file.readline()
        if line != "go\n":
            raise RuntimeError(f"benchmark gate: expected 'go', got {line!r}")

    def report(self, seconds):
        """Sends the duration (seconds) of the repetition just run."""
        if self._file is not None:
            self._send({"seconds": seconds})

    def close(self):
        """Waits for the benchmark to end the round (it closes)."""
        if self._file is not None:
            self._file.read()
            self._file.close()

    def _send(self, message):
        self._file.write(json.dumps(message) + "\n")
        self._file.flush()
