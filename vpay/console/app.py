"""The console's WSGI app: one Falcon app, server-rendered (Jinja2, autoescaped),
on its own port (``vpay-server console``), never the API's. The parts:
``vpay.console.web`` (sessions, CSRF, roles, headers, forms, static files),
``vpay.console.pages`` (a resource per page), ``vpay.console.accounts``
(operators and sessions)."""

from __future__ import annotations

import logging

import falcon

from vpay.api.app import Database
from vpay.console import accounts, pages
from vpay.console.web import COOKIE, ConsoleApp, Guard, Static, _templates

__all__ = ["COOKIE", "ConsoleApp", "create_app"]

log = logging.getLogger("vpay.console")


def _on_unexpected(req, resp, exc, params) -> None:
    if isinstance(exc, falcon.HTTPError):
        raise exc
    log.error("unhandled error", exc_info=exc, extra={"route": req.uri_template})
    raise falcon.HTTPInternalServerError(title="Internal error", description="Logged; see the console's log.")


def create_app(database_url: str, *, secure_cookie: bool = True,
               limits: accounts.SessionLimits | None = None, db_timeout: float = 5.0) -> ConsoleApp:
    """The console app. ``secure_cookie=False`` only for loopback without
    TLS. ``app.vpay_db.close()`` when done."""
    app = ConsoleApp(media_type=falcon.MEDIA_HTML)
    app.vpay_db = Database(database_url, timeout=db_timeout)
    app.templates = _templates()
    app.limits = limits or accounts.SessionLimits.from_env()
    app.secure_cookie = secure_cookie
    app.add_middleware(Guard(app))
    app.req_options.auto_parse_form_urlencoded = False
    app.add_error_handler(Exception, _on_unexpected)
    app.set_error_serializer(pages.error_page(app))
    app.add_route("/static/{name}", Static())
    pages.add_routes(app)
    return app
