"""A local test/demo double of MTN MoMo's Collection API ("request to pay")
and of the Disbursement API's refunds: ``SandboxRail``.

This is **not** MTN's sandbox and never talks to MTN: it is an in-process HTTP
server that answers the public MoMo API closely enough that a real MoMo
client (vpay's MTN adapter, or any client written against
https://momodeveloper.mtn.com/api-documentation) works against it unchanged,
for demos and end-to-end tests. Standard library only. The full behaviour is
in docs/sandbox.md; each part documents its own endpoints:

* ``auth``: the token endpoints, subscription keys, target environment, EUR only.
* ``collection``: request to pay (the Collection product).
* ``disbursement``: refunds (the Disbursement product).
* ``transactions``: the create and status calls both products share, written once.
* ``accounts``: balance and account-holder checks of either product.
* ``ledger``: transactions, the success timer, status bodies, callbacks.
* ``scripts``: the scripted payers' options.
* ``control``: the ``/_sandbox/*`` control API and its Python twin.
* ``routes``: path -> handler, the request log, the request handler.
* ``codes``: default credentials, MTN's sandbox payers, reason codes, error bodies.
* ``rail``: ``SandboxRail``, the parts put together; ``cli``: ``python -m vpay.sandbox.mtn``.

A new MoMo product is one module like ``disbursement`` (a ``Kind``) added to
``routes.KINDS``."""

from __future__ import annotations

from vpay.sandbox.mtn.cli import main
from vpay.sandbox.mtn.codes import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_OPENING_BALANCE, DEFAULT_SUBSCRIPTION_KEY, REASON_MESSAGES, REFUND_TARGET_NOT_FOUND, REFUND_TARGET_NOT_SUCCESSFUL, SANDBOX_CURRENCY, SANDBOX_FAILURES, STATUSES, _error, _error_for_http, _Resp
from vpay.sandbox.mtn.rail import SandboxRail
# The request handler and the answer helpers stay importable from here:
# bench/chaos_rail.py builds its fault layer on them.
from vpay.sandbox.mtn.routes import _Handler  # noqa: F401

__all__ = [
    "SandboxRail",
    "SANDBOX_FAILURES",
    "REASON_MESSAGES",
    "DEFAULT_SUBSCRIPTION_KEY",
    "DEFAULT_API_USER",
    "DEFAULT_API_KEY",
    "SANDBOX_CURRENCY",
    "main",
]
