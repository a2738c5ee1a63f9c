"""Entry point: python3 -m roleplay."""

import sys

from .cli import main

sys.exit(main())
