"""`python -m pytest_opperf.cli`: the `opperf` command."""

import sys

from pytest_opperf.cli import main

sys.exit(main())
