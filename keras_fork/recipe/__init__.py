"""The build recipe: upstream sdist -> series -> tree -> wheel.

* ``pins``: the pinned bases (``keras_fork/bases.toml``) and where things
  live (``Layout``);
* ``sdist``: fetch and verify the upstream sdist (sha256);
* ``series``: materialize a base's tree from the sdist and ``patches/<V>``,
  re-export it, check it;
* ``wheel``: the fork wheel ``keras-<V>+fork.<N>``.

The PR series made from the same tree is ``keras_fork.upstream.prseries``
(the ``pr-series`` verb): it also reads the proof's results.
"""
