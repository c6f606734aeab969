"""Merchant authentication: ``Authorization: Bearer <secret key>``.

Keys are issued by ``vpay-server merchants create`` and checked by
``vpay.money.merchants.authenticate`` (sha256 stored, constant-time compare). A
missing, malformed, unknown or revoked key is 401 ``invalid_api_key`` and
nothing is written: the check runs before the route's responder.
"""

from __future__ import annotations

import falcon

from vpay.money import merchants
from vpay.api.errors import unauthorized


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme
    case-insensitive), or ``None``."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class MerchantAuth:
    """Falcon middleware: routes whose resource has ``merchant_api = True``
    need a valid key; ``req.context.merchant_id`` is then the key's merchant."""

    def __init__(self, db):
        self.db = db

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource, params) -> None:
        if not getattr(resource, "merchant_api", False):
            return
        token = bearer_token(req.get_header("Authorization"))
        if token is None:
            raise unauthorized("No valid API key provided: use 'Authorization: Bearer <secret key>'.")
        with self.db.connection() as conn:
            merchant_id = merchants.authenticate(conn, token)
        if merchant_id is None:
            raise unauthorized()
        req.context.merchant_id = merchant_id
