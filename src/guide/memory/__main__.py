"""``python -m guide.memory``: the ``guide-memory`` command (:mod:`guide.memory.cli`)."""

import sys

from guide.memory.cli import main

sys.exit(main())
