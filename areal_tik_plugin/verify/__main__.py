"""``python -m areal_tik_plugin.verify ...`` (the same as ``tik verify ...``)."""

import sys

from areal_tik_plugin.verify import main

sys.exit(main())
