"""Request plumbing shared by the routes: bounded body reads and JSON answers."""

from __future__ import annotations

from typing import Any

import falcon

from vpay.api.errors import dump, error_body, invalid

MAX_BODY_BYTES = 64 * 1024
"""Largest body any route reads (64 KiB). A larger declared Content-Length is
refused before a byte is read; a chunked body is read to one byte past it."""


def too_large(limit: int):
    return invalid("request_too_large", f"The request body exceeds {limit} bytes.", status=413)


def read_body(req: falcon.Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, at most ``limit`` bytes. Raises ``ApiError`` 413
    when it is longer, without reading it whole: a declared Content-Length
    above the limit is refused unread (Falcon's ``content_length``; an
    unparseable one is Falcon's 400), and a chunked body (no Content-Length;
    the WSGI server de-chunks) is read to ``limit + 1`` bytes at most."""
    length = req.content_length
    if length is not None:
        if length > limit:
            raise too_large(limit)
        return req.bounded_stream.read(length)
    if "chunked" in (req.get_header("Transfer-Encoding") or "").lower():
        data = req.stream.read(limit + 1)
        if len(data) > limit:
            raise too_large(limit)
        return data
    return b""


def answer(resp: falcon.Response, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
    """Set a JSON answer (``errors.dump`` bytes)."""
    resp.status = status
    resp.data = body if isinstance(body, bytes) else dump(body)
    resp.content_type = falcon.MEDIA_JSON
    for name, value in (headers or {}).items():
        resp.set_header(name, value)


def server_error_body(status: int) -> tuple[str, bytes]:
    """``(content_type, body)`` for an error the HTTP server answers before
    the app sees the request (``vpay.api.server``: a malformed request, a
    body or headers over its limits), in the API's error shape: a 413 is
    ``request_too_large`` like the routes' own."""
    exc = too_large(MAX_BODY_BYTES) if status == 413 else falcon.HTTPError(status)
    return falcon.MEDIA_JSON, dump(error_body(exc))
