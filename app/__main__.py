"""`python -m app` runs the `autoscaler` command line."""

import sys

from app.cli import main

sys.exit(main())
