"""`python3 -m research`: see research/cli.py."""

import sys

from research.cli import main

sys.exit(main())
