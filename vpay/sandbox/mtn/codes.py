"""The MoMo sandbox's words: MTN-shaped default credentials, MTN's sandbox
payer numbers and the reason each FAILs with, the documented messages of
reason and error codes, the status words, and the MoMo-shaped error answers
(``{"code", "message"}`` with the HTTP statuses of MTN's common-errors
table: 401 bad subscription key / credentials / token; 400 ``BAD_REQUEST``;
409 ``RESOURCE_ALREADY_EXIST``; 404 ``RESOURCE_NOT_FOUND``; 500
``NOT_ALLOWED_TARGET_ENVIRONMENT``, ``INVALID_CURRENCY``,
``INVALID_CALLBACK_URL_HOST``)."""

from __future__ import annotations

import re
from typing import Any

from vpay.sandbox.server import Answer

# MTN-shaped defaults (docs/sandbox.md "Credentials"): a subscription key is
# 32 hex characters, an API user a UUID version 4, an API key 32 hex
# characters, as MTN's portal and its sandbox provisioning API hand them out.
# They open this local double only: not secrets, never valid at MTN.
DEFAULT_SUBSCRIPTION_KEY = "0f3c5a7e9b1d4f6a8c2e4b6d8f0a1c3e"
DEFAULT_API_USER = "7c1e3f0a-5b2d-4e8a-9c6f-0d1b2a3c4e5f"
DEFAULT_API_KEY = "5d2b8e4f1a7c4e9b8d3f6a2c9e1b7d40"

#: The only currency MTN's sandbox (``X-Target-Environment: sandbox``) takes.
SANDBOX_CURRENCY = "EUR"
#: What each account (Collection, Disbursement) holds before any transaction.
DEFAULT_OPENING_BALANCE = "1000.00"

#: MTN's sandbox payer numbers and the reason each one FAILs with (at once).
#: ONGOING and PAYER_DELAYED stay FAILED with that reason for ever (vpay
#: reads them as "still pending").
SANDBOX_FAILURES: dict[str, str] = {
    "46733123450": "INTERNAL_PROCESSING_ERROR",
    "46733123451": "APPROVAL_REJECTED",
    "46733123452": "EXPIRED",
    "46733123453": "ONGOING",
    "46733123454": "PAYER_DELAYED",
    "46733123455": "PAYER_NOT_FOUND",
    "46733123456": "PAYEE_NOT_ALLOWED_TO_RECEIVE",
    "46733123457": "NOT_ALLOWED",
    "46733123458": "NOT_ALLOWED_TARGET_ENVIRONMENT",
    "46733123459": "INVALID_CALLBACK_URL_HOST",
    "46733123460": "INVALID_CURRENCY",
    "46733123461": "INTERNAL_PROCESSING_ERROR",
    "46733123462": "SERVICE_UNAVAILABLE",
    "46733123463": "COULD_NOT_PERFORM_TRANSACTION",
}

#: Human messages for reason/error codes (MoMo's documented descriptions).
REASON_MESSAGES: dict[str, str] = {
    "PAYEE_NOT_FOUND": "Payee does not exist",
    "PAYER_NOT_FOUND": "Payer does not exist",
    "NOT_ALLOWED": "Authorization failed. Insufficient permissions",
    "NOT_ALLOWED_TARGET_ENVIRONMENT": "Access to target environment is forbidden",
    "INVALID_CALLBACK_URL_HOST": "Callback URL does not match the configured value",
    "INVALID_CURRENCY": "Currency not supported",
    "SERVICE_UNAVAILABLE": "Service temporarily unavailable, try again later",
    "INTERNAL_PROCESSING_ERROR": "An internal error occurred while processing",
    "NOT_ENOUGH_FUNDS": "The payer does not have enough funds",
    "PAYER_LIMIT_REACHED": "The payer's limit has been breached",
    "PAYEE_NOT_ALLOWED_TO_RECEIVE": "The payee is unable to receive funds",
    "PAYMENT_NOT_APPROVED": "Payment was not approved",
    "RESOURCE_NOT_FOUND": "Requested resource was not found",
    "APPROVAL_REJECTED": "The approval was rejected",
    "EXPIRED": "The requested resource has expired",
    "TRANSACTION_CANCELED": "The transaction was canceled by the initiator",
    "RESOURCE_ALREADY_EXIST": "Duplicated reference id. Creation of resource failed",
    "REFUND_TARGET_NOT_FOUND": "referenceIdToRefund names no transaction (sandbox code)",
    "REFUND_TARGET_NOT_SUCCESSFUL": "The transaction to refund is not SUCCESSFUL (sandbox code)",
    "ONGOING": "The transaction is still ongoing",
    "PAYER_DELAYED": "The payer has not yet responded",
    "COULD_NOT_PERFORM_TRANSACTION": "The payer did not approve the transaction in time",
    "BAD_REQUEST": "Request does not follow the specification",
}

PENDING, SUCCESSFUL, FAILED = "PENDING", "SUCCESSFUL", "FAILED"
STATUSES = (PENDING, SUCCESSFUL, FAILED)
TERMINAL = (SUCCESSFUL, FAILED)
DEFAULT_DECLINE = "APPROVAL_REJECTED"
DEFAULT_REFUND_FAILURE = "INTERNAL_PROCESSING_ERROR"
# Both refund codes are this sandbox's own: MoMo documents none for these cases.
REFUND_TARGET_NOT_FOUND = "REFUND_TARGET_NOT_FOUND"
REFUND_TARGET_NOT_SUCCESSFUL = "REFUND_TARGET_NOT_SUCCESSFUL"

COLLECTION, DISBURSEMENT = "collection", "disbursement"

UUID4_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-4[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$"
)
AMOUNT_RE = re.compile(r"^[0-9]+(\.[0-9]+)?$")

#: The MoMo sandbox's answers are the shared ``Answer`` (``_Resp`` is its old name).
_Resp = Answer


def _error(status: int, code: str, message: str | None = None, **extra: Any) -> Answer:
    """A MoMo-shaped error answer: ``{"code", "message"}`` (the message
    defaults to the code's documented one) plus ``extra`` fields."""
    body = {"code": code, "message": message or REASON_MESSAGES.get(code, code)}
    body.update(extra)
    return Answer(status, body)


def _error_for_http(status: int) -> Answer:
    """A MoMo-shaped error body for a scripted HTTP status code."""
    if status == 500:
        return _error(500, "INTERNAL_PROCESSING_ERROR")
    if status == 503:
        return _error(503, "SERVICE_UNAVAILABLE")
    if status == 404:
        return _error(404, "RESOURCE_NOT_FOUND")
    if status == 409:
        return _error(409, "RESOURCE_ALREADY_EXIST")
    if status == 401:
        return _error(401, "ACCESS_DENIED", "Access denied due to invalid token", statusCode=401)
    if status == 429:
        return _error(429, "RATE_LIMIT_EXCEEDED", "Rate limit is exceeded. Try again later", statusCode=429)
    if status == 400:
        return _error(400, "BAD_REQUEST")
    return _error(status, "INTERNAL_PROCESSING_ERROR" if status >= 500 else "BAD_REQUEST",
                  f"Sandbox scripted HTTP {status}")


def _method_not_allowed() -> Answer:
    return _error(405, "METHOD_NOT_ALLOWED", "Method not allowed", statusCode=405)


def _not_found() -> Answer:
    """The 404 of a path this sandbox does not serve."""
    return _error(404, "RESOURCE_NOT_FOUND", "Resource not found", statusCode=404)
