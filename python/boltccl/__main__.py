"""``python -m boltccl`` is ``python -m boltccl.launch``."""

import sys

from .launch import main

sys.exit(main())
