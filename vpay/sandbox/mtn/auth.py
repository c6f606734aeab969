"""The MoMo sandbox's access rules, per product (Collection, Disbursement):
the token endpoints and the checks every other call passes first.

    POST {base}/collection/token/    -> 200 {access_token, token_type, expires_in}
        needs Ocp-Apim-Subscription-Key and Authorization: Basic base64(api_user:api_key)
    POST {base}/disbursement/token/  -> the same with the Disbursement credentials
        (constructor ``disbursement_*``, default: the Collection ones)

A product's token and subscription key open that product's endpoints only (a
Collection token is refused by Disbursement endpoints and vice versa). Every
call then needs ``X-Target-Environment`` equal to ``target_environment``
(else 500 ``NOT_ALLOWED_TARGET_ENVIRONMENT``), and in the ``sandbox``
environment a money call in EUR only (else 500 ``INVALID_CURRENCY``, nothing
recorded: MTN's sandbox is EUR only).

The ``Auth`` mixin needs the rail's credentials, ``token_ttl_seconds``,
``target_environment``, ``_lock`` and the token tables ``_tokens`` /
``_disbursement_tokens`` (sha256 of a token -> monotonic expiry)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from typing import Any

from vpay.sandbox.server import Answer
from vpay.sandbox.mtn.codes import DISBURSEMENT, SANDBOX_CURRENCY, _error


class Auth:
    """Tokens and the checks of a MoMo call."""

    def _credentials(self, product: str) -> tuple[str, str, str]:
        """``(subscription_key, api_user, api_key)`` of ``product``."""
        if product == DISBURSEMENT:
            return self.disbursement_subscription_key, self.disbursement_api_user, self.disbursement_api_key
        return self.subscription_key, self.api_user, self.api_key

    def _token_table(self, product: str) -> dict[str, float]:
        return self._disbursement_tokens if product == DISBURSEMENT else self._tokens

    def _check_subscription(self, headers: Any, product: str) -> Answer | None:
        key = headers.get("Ocp-Apim-Subscription-Key")
        expected = self._credentials(product)[0]
        if not key or not hmac.compare_digest(key.encode(), expected.encode()):
            what = "missing" if not key else "invalid"
            return _error(401, "ACCESS_DENIED",
                          f"Access denied due to {what} subscription key. "
                          "Make sure to provide a valid key for an active subscription.",
                          statusCode=401)
        return None

    def _check_bearer(self, headers: Any, product: str) -> Answer | None:
        auth = headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _error(401, "ACCESS_DENIED", "Access denied due to missing or invalid access token", statusCode=401)
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            expiry = self._token_table(product).get(digest)
        if expiry is None:
            return _error(401, "ACCESS_DENIED", "Access denied due to invalid access token", statusCode=401)
        if expiry <= time.monotonic():
            return _error(401, "ACCESS_DENIED", "Access token expired", statusCode=401)
        return None

    def _check_target(self, headers: Any) -> Answer | None:
        # HTTP 500, not 400: MTN's common-errors table (docs/sandbox.md, "Errors").
        if headers.get("X-Target-Environment") != self.target_environment:
            return _error(500, "NOT_ALLOWED_TARGET_ENVIRONMENT")
        return None

    def _product_checks(self, headers: Any, product: str) -> Answer | None:
        """Subscription key and Bearer token of ``product``, then the target
        environment: the first refusal, or None."""
        return (self._check_subscription(headers, product) or self._check_bearer(headers, product)
                or self._check_target(headers))

    def _check_currency(self, currency: str) -> Answer | None:
        """MTN's sandbox takes EUR only: another currency is refused with
        500 ``INVALID_CURRENCY`` and nothing is recorded. Other target
        environments take any ISO 4217 code."""
        if self.target_environment == "sandbox" and currency != SANDBOX_CURRENCY:
            return _error(500, "INVALID_CURRENCY",
                          f"Currency {currency} is not supported: the sandbox takes {SANDBOX_CURRENCY} only")
        return None

    def _token(self, method: str, headers: Any, product: str) -> Answer:
        """``POST /{product}/token/``: a Bearer token for ``product``."""
        err = self._check_subscription(headers, product)
        if err:
            return err
        _, api_user, api_key = self._credentials(product)
        scheme, _, cred = headers.get("Authorization", "").partition(" ")
        try:
            decoded = base64.b64decode(cred.strip(), validate=True) if scheme.lower() == "basic" else None
        except (binascii.Error, ValueError):
            decoded = None
        if decoded is None or not hmac.compare_digest(decoded, f"{api_user}:{api_key}".encode()):
            return _error(401, "LOGIN_FAILED", "Authentication failed: invalid API user or API key")
        token = secrets.token_urlsafe(32)
        tokens = self._token_table(product)
        with self._lock:
            now = time.monotonic()
            # drop expired tokens so the table cannot grow for ever
            for k in [k for k, exp in tokens.items() if exp <= now]:
                del tokens[k]
            tokens[hashlib.sha256(token.encode()).hexdigest()] = now + self.token_ttl_seconds
        return Answer(200, {"access_token": token, "token_type": "access_token",
                            "expires_in": self.token_ttl_seconds})
