"""`python -m biasaudit ...`: the biasaudit command (see biasaudit.cli)."""

import sys

from biasaudit.cli import main

sys.exit(main())
