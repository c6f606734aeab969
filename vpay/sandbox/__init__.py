"""Sandbox rails for demos, tests and a merchant's local development: real
HTTP servers on loopback that speak the MTN MoMo (``mtn``: Collection and
Disbursement) and Orange Money Web Payment (``orange``) APIs, with scripted
payers. They are test doubles, not rails: nothing in ``vpay.rails`` imports
them. ``server`` is their shared serving (handler, answers, lifecycle);
``statement`` exports the MoMo sandbox's ledger as a statement file. A new
rail's sandbox is one module (or package) on ``server``: a
``ServedDouble`` subclass and a ``SandboxHandler`` subclass. The full
behaviour is in docs/sandbox.md."""
