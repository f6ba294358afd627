"""Kernel implementations (installed as ``areal_tik_plugin.kernels``).

Each sub-folder is one *implementation*: complete sources of every op plus ``manifest.json``.
Implementations are loaded by path through :mod:`areal_tik_plugin.runtime.loader`, never imported as
ordinary sub-packages, so the search can create new ones anywhere (run directories) and the loader
can verify the source hash of exactly what it loads.
"""

import os

KERNELS_DIR = os.path.dirname(os.path.abspath(__file__))
