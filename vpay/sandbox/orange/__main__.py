"""``python -m vpay.sandbox.orange``: runs ``cli.main``."""

from .cli import main

raise SystemExit(main())
