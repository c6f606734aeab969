"""``python -m vpay.sandbox.orange``: runs ``cli.main``."""

from vpay.sandbox.orange.cli import main

raise SystemExit(main())
