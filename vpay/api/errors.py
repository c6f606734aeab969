"""Errors as a Stripe user expects them: ``{"error": {type, code, message,
param?}}`` with 400/401/404/409/413/422, 500/503 for our own trouble.

Every error the app answers goes through ``serialize``: the ones we raise
(``ApiError``) and Falcon's own (unknown route, wrong method, bad header),
so a client never sees another shape or a stack trace from the app. (A request
gunicorn itself cannot parse, such as ``Content-Length: abc``, gets gunicorn's
own plain 400 before the app runs.)
"""

from __future__ import annotations

import json
from typing import Any

import falcon

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
IDEMPOTENCY = "idempotency_error"
API_ERROR = "api_error"

# Falcon's own errors (routing, headers) mapped to (type, code).
_BY_STATUS = {
    400: (INVALID_REQUEST, "bad_request"),
    401: (AUTHENTICATION, "invalid_api_key"),
    404: (INVALID_REQUEST, "resource_missing"),
    405: (INVALID_REQUEST, "method_not_allowed"),
    411: (INVALID_REQUEST, "length_required"),
    413: (INVALID_REQUEST, "request_too_large"),
    415: (INVALID_REQUEST, "unsupported_media_type"),
    422: (INVALID_REQUEST, "parameter_invalid"),
    503: (API_ERROR, "service_unavailable"),
}
_MESSAGES = {404: "Unrecognized request URL.", 405: "Method not allowed for this URL."}


class ApiError(falcon.HTTPError):
    """An error answer. ``status`` an int (400, 401, ...), ``type_`` and
    ``code`` Stripe-style strings, ``param`` the offending request field when
    there is one (``payment_method[msisdn]``)."""

    def __init__(self, status: int, type_: str, code: str, message: str,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(status, title=code, description=message, headers=headers)
        self.type_ = type_
        self.code = code
        self.message = message
        self.param = param


def invalid(code: str, message: str, param: str | None = None, status: int = 400) -> ApiError:
    return ApiError(status, INVALID_REQUEST, code, message, param)


def not_found(message: str, param: str | None = None) -> ApiError:
    return ApiError(404, INVALID_REQUEST, "resource_missing", message, param)


def unauthorized(message: str = "Invalid API key provided.") -> ApiError:
    return ApiError(401, AUTHENTICATION, "invalid_api_key", message,
                    headers={"WWW-Authenticate": 'Bearer realm="vpay"'})


def unavailable(message: str = "The service is temporarily unavailable; retry later.") -> ApiError:
    return ApiError(503, API_ERROR, "service_unavailable", message, headers={"Retry-After": "1"})


def internal() -> ApiError:
    return ApiError(500, API_ERROR, "internal_error",
                    "An error occurred on our side; the request may be retried.")


def error_body(exc: falcon.HTTPError) -> dict[str, Any]:
    """The JSON object answered for ``exc``."""
    if isinstance(exc, ApiError):
        err = {"type": exc.type_, "code": exc.code, "message": exc.message}
        if exc.param is not None:
            err["param"] = exc.param
        return {"error": err}
    status = exc.status_code
    type_, code = _BY_STATUS.get(status, (API_ERROR if status >= 500 else INVALID_REQUEST,
                                          f"http_{status}"))
    # Falcon's own texts are generic (no request data, no trace).
    message = exc.description or _MESSAGES.get(status) or exc.title or falcon.util.code_to_http_status(status)
    return {"error": {"type": type_, "code": code, "message": str(message)}}


def dump(obj: Any) -> bytes:
    """The one JSON encoding of every answer: stable bytes, so a replayed
    Idempotency-Key answer is byte-identical to the first."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def serialize(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    """Falcon error serializer: every error is JSON of our shape."""
    resp.data = dump(error_body(exc))
    resp.content_type = falcon.MEDIA_JSON
