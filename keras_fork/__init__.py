"""Recipe and tooling of the Keras fork: pinned upstream bases, patch series,
reproducible wheels, PR series and the stock-vs-fork proof matrix."""
