"""`python -m trainprof`: the `trainprof` command line."""

import sys

from trainprof.cli import main

if __name__ == "__main__":
    sys.exit(main())
