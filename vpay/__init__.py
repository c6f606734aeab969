"""vpay-reconciler: the worker that decides how mobile-money payments end.

The behaviour spec is the design page (docs/design/reconciler.md); the names
are fixed by docs/design/contract.md.
"""

__version__ = "0.5.0"
