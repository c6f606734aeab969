"""The HTTP API: rail callbacks (hints only) and the merchant's payment
intents, one Falcon WSGI app served by gunicorn (``vpay-server api``).
Routes, auth, errors and idempotency are described in docs/api.md; the
OpenAPI document is ``vpay.api.openapi.DOCUMENT`` (served at /openapi.json).
"""
