"""`python -m cellar ...` is the same as the `cellar` command."""

import sys

from cellar.cli import main

sys.exit(main())
