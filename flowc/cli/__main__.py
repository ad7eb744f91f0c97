"""`python -m flowc.cli`: the `flowc` command."""
import sys

from flowc.cli import main

sys.exit(main())
