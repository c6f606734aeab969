"""``python -m vpay.sandbox.mtn``: runs ``cli.main``."""

from vpay.sandbox.mtn.cli import main

raise SystemExit(main())
