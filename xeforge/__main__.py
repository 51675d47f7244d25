"""``python -m xeforge`` runs the CLI."""

import sys

from xeforge.cli import main

sys.exit(main())
