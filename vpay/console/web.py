"""The console's web plumbing: the app type, the templates, the security
middleware, forms, static files and cookies (``vpay.console.app`` puts them
together with the pages).

Security, in one middleware (``Guard``), for every route:

* a session from the ``vpay_console`` cookie (``vpay.console.accounts``), or a
  redirect to ``/login``; the cookie is ``HttpOnly``, ``SameSite=Strict``,
  ``Path=/`` and ``Secure`` unless the app was made with ``secure_cookie=False``
  (only ``vpay-server console`` on a loopback bind without TLS does that);
* every POST carries the session's CSRF token (``csrf_token`` form field),
  else 403 and nothing is written; the sign-in form carries a token bound to
  a pre-session cookie (double submit);
* roles: a POST needs ``operator`` (``admin`` for the routes in
  ``ADMIN_POSTS``); a viewer's POST is 403 and changes nothing;
* headers on every answer: ``Content-Security-Policy`` (no inline script or
  style, ``frame-ancestors 'none'``), ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: no-referrer``, ``Cache-Control: no-store``.

Forms are read once, bounded (``MAX_FORM_BYTES``), into ``req.context.form``.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from importlib import resources
from typing import Any

import falcon
import jinja2

from vpay.api.app import Database
from vpay.console import accounts

log = logging.getLogger("vpay.console")
access_log = logging.getLogger("vpay.console.access")

COOKIE = "vpay_console"
LOGIN_COOKIE = "vpay_console_login"
MAX_FORM_BYTES = 10 * 1024 * 1024
"""A statement upload is the largest form; 10 MiB is months of lines."""

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")

PUBLIC = ("/login", "/static/", "/favicon.ico")
ADMIN_POSTS = ("/webhooks/endpoints/",)
STATIC = {"htmx-2.0.4.min.js": "text/javascript", "htmx-LICENSE.txt": "text/plain; charset=utf-8",
          "console.css": "text/css"}

ROLE_RANK = {"viewer": 0, "operator": 1, "admin": 2}


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("vpay.console", "templates"),
                             autoescape=True, undefined=jinja2.ChainableUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    from vpay.console import render
    env.filters.update(render.FILTERS)
    return env


class ConsoleApp(falcon.App):
    """``falcon.App`` with the console's ``Database`` (``vpay_db``),
    templates (``templates``) and session limits (``limits``)."""

    vpay_db: Database
    templates: jinja2.Environment
    limits: accounts.SessionLimits
    secure_cookie: bool


def _address(req: falcon.Request) -> str:
    return req.remote_addr or "unknown"


class Guard:
    """Sessions, CSRF, roles and security headers (see the module doc)."""

    def __init__(self, app: ConsoleApp):
        self.app = app

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.started = time.monotonic()
        req.context.session = None
        req.context.form = {}
        if req.path.startswith("/static/") or req.path == "/favicon.ico":
            return
        if req.method == "POST":
            req.context.form = _read_form(req)
        if req.path == "/login":
            return
        session_id = req.get_cookie_values(COOKIE)
        session = None
        if session_id:
            with self.app.vpay_db.connection() as conn:
                session = accounts.load_session(conn, session_id[0], self.app.limits)
        if session is None:
            if req.method == "POST" or req.get_header("HX-Request"):
                raise falcon.HTTPForbidden(title="Signed out", description="Sign in again.")
            raise falcon.HTTPSeeOther("/login")
        req.context.session = session
        req.context.session_id = session_id[0]
        if req.method == "POST":
            token = req.context.form.get("csrf_token")
            if not isinstance(token, str) or not hmac.compare_digest(token, session["csrf_token"]):
                log.warning("csrf token refused", extra={"route": req.path, "operator": session["email"]})
                raise falcon.HTTPForbidden(title="Refused", description="The form's token is missing or wrong.")
            needed = "admin" if req.path.startswith(ADMIN_POSTS) else "operator"
            if req.path != "/logout" and ROLE_RANK[session["role"]] < ROLE_RANK[needed]:
                raise falcon.HTTPForbidden(title="Not allowed",
                                           description=f"This needs the {needed} role.")

    def process_response(self, req, resp, resource, req_succeeded) -> None:
        resp.set_header("Content-Security-Policy", CSP)
        resp.set_header("X-Content-Type-Options", "nosniff")
        resp.set_header("X-Frame-Options", "DENY")
        resp.set_header("Referrer-Policy", "no-referrer")
        if not req.path.startswith("/static/"):
            resp.set_header("Cache-Control", "no-store")
        started = getattr(req.context, "started", None)
        access_log.info("request", extra={
            "method": req.method, "route": req.uri_template or "(no route)", "status": resp.status_code,
            "ms": round((time.monotonic() - started) * 1000, 1) if started else None})


def _read_form(req: falcon.Request) -> dict[str, Any]:
    """The POST's fields: ``{name: str}``, a repeated name as a list, a file
    as ``(filename, bytes)``. 413 past ``MAX_FORM_BYTES``."""
    if (req.content_length or 0) > MAX_FORM_BYTES:
        raise falcon.HTTPContentTooLarge(title="Too large", description="At most 10 MiB.")
    ctype = (req.content_type or "").split(";")[0].strip().lower()
    form: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        if name in form:
            old = form[name]
            form[name] = (old if isinstance(old, list) else [old]) + [value]
        else:
            form[name] = value
    if ctype == "multipart/form-data":
        for part in req.get_media():
            if part.filename is not None:
                put(part.name, (part.secure_filename if part.filename else "", part.stream.read()))
            else:
                put(part.name, part.text)
    elif ctype == "application/x-www-form-urlencoded":
        from urllib.parse import parse_qsl
        body = req.bounded_stream.read(MAX_FORM_BYTES + 1).decode("utf-8", "replace")
        for name, value in parse_qsl(body, keep_blank_values=True):
            put(name, value)
    return form


class Static:
    """``GET /static/{name}``: the package's own files (htmx, its licence,
    the style sheet), never a CDN."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        if name not in STATIC:
            raise falcon.HTTPNotFound()
        resp.data = resources.files("vpay.console").joinpath("static", name).read_bytes()
        resp.content_type = STATIC[name]
        resp.set_header("Cache-Control", "public, max-age=86400")


def set_session_cookie(app: ConsoleApp, resp: falcon.Response, value: str, *, max_age: int | None) -> None:
    """The session cookie: HttpOnly, SameSite=Strict, Secure unless the app is on loopback without TLS."""
    resp.set_cookie(COOKIE, value, max_age=max_age, path="/", secure=app.secure_cookie, http_only=True,
                    same_site="Strict")


def new_login_token(app: ConsoleApp, req: falcon.Request, resp: falcon.Response) -> str:
    """The sign-in CSRF token, also set as the pre-session cookie: the one
    the browser holds, if any (a second GET /login, e.g. the browser's own
    favicon request redirected here, must not void the open form), else new."""
    held = req.get_cookie_values(LOGIN_COOKIE)
    token = held[0] if held and 20 <= len(held[0]) <= 64 else secrets.token_urlsafe(24)
    resp.set_cookie(LOGIN_COOKIE, token, max_age=3600, path="/login", secure=app.secure_cookie,
                    http_only=True, same_site="Strict")
    return token
