"""``python -m yxanul``: the same entry point as the ``yxanul`` command."""

import sys

from .cli import main

sys.exit(main())
