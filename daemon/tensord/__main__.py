"""`python -m tensord`: the tensord command (the supervisor starts its children so)."""

import sys

from tensord.cli import main

sys.exit(main())
