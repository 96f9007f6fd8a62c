"""`python -m cellar.devtools.soak`: the soak's command line (workers are started this way)."""

import sys

from cellar.devtools.soak.run import main

sys.exit(main())
