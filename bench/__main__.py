"""`python -m bench [suite ...] [--quick] [--record]`: runs the registered suites (see harness)."""

import sys

from bench.harness import main

if __name__ == "__main__":
    sys.exit(main())
