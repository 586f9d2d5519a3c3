"""`python -m mutransfer.cli ...`: the `mutransfer` command."""

import sys

from ._main import main

sys.exit(main())
