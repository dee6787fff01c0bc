"""Where upstream stands and what it is sent: each series against its base
and the newest keras-nightly (``status``), upstream's own unit tests
(``regressions``), each PR alone on a Keras checkout (``pr-check``,
``pr-tests``), and the PR series itself (``pr-series``, with the proof's
results)."""
