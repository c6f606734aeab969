"""The money domain: payments, charges, refunds and the rules that move them
(docs/architecture.md, "Layers"). It builds on the job engine
(``vpay.engine``) and speaks to rails only through the port
(``vpay.rails.port``). Importing it registers its lanes (``lanes``)."""

from . import lanes as _lanes  # noqa: F401  (registers the domain's lanes with the engine)
