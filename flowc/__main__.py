"""`python -m flowc ...`: the same as the `flowc` command (see flowc/cli)."""
import sys

from flowc.cli import main

if __name__ == "__main__":
    sys.exit(main())
