"""``python -m <this package>``: ``verify`` (``harness.verify``), the fix
tests against whichever keras is importable."""

import sys

from .harness import verify

if __name__ == "__main__":
    sys.exit(verify.main(prog=f"python -m {__package__}"))
