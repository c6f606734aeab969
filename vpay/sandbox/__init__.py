"""Sandbox rails for demos, tests and a merchant's local development: real
HTTP servers on loopback that speak the MTN MoMo (``mtn``) and Orange Money
Web Payment (``orange``) APIs, with scripted payers. They are test doubles,
not rails: nothing in ``vpay.rails`` imports them. ``server`` is their shared
server plumbing. The full behaviour is in docs/sandbox.md."""
