"""The build recipe: upstream sdist -> series -> tree -> wheel / PR series.

* ``pins``: the pinned bases (``keras_fork/bases.toml``) and where things
  live (``Layout``);
* ``sdist``: fetch and verify the upstream sdist (sha256);
* ``series``: materialize a base's tree from the sdist and ``patches/<V>``,
  re-export it, check it;
* ``wheel``: the fork wheel ``keras-<V>+fork.<N>``;
* ``prseries``: the PR series for upstream maintainers.
"""
