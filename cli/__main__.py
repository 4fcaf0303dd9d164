"""`python -m cli`: the same as `tessera`."""

import sys

from cli.main import main

sys.exit(main())
