"""``python -m keras_fork <verb>``: see ``keras_fork.cli``."""

import sys

from keras_fork.cli import main

if __name__ == "__main__":
    sys.exit(main())
