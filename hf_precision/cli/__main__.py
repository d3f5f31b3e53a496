"""``python -m hf_precision.cli``: the same as the ``hf-precision`` command."""

import sys

from . import main

sys.exit(main())
