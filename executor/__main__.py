"""`python -m executor` runs the worker agent alone (`autoscaler-worker`): no planner, no SQL."""

import sys

from executor.cli import main

sys.exit(main())
