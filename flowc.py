"""`python -m flowc ...`: the same as the `flowc` command (see compiler/cli)."""
import sys

from compiler.cli import main

if __name__ == "__main__":
    sys.exit(main())
