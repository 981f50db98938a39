"""`python -m mixgraph ...`: the same command line as the `mixgraph` console script."""

import sys

from mixgraph.ui.cli import main

sys.exit(main())
