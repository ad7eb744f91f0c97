"""`python -m compiler.cli`: the `flowc` command."""
import sys

from compiler.cli import main

sys.exit(main())
