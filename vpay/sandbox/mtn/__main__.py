"""``python -m vpay.sandbox.mtn``: runs ``cli.main``."""

from .cli import main

raise SystemExit(main())
