"""`python -m autoscaler` runs the command line."""

import sys

from autoscaler.cli import main

sys.exit(main())
