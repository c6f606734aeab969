"""vpay-reconciler: the worker that decides how mobile-money payments end.

The behaviour spec is the design page (shared/seeds/reconciler.md); the names
are fixed by shared/design/contract.md.
"""

__version__ = "0.5.0"
