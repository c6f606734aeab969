"""``vpay-server console`` (the operator console, its own process and port)
and ``vpay-server operators create|list|disable`` (who may sign in to it).

``console --bind HOST:PORT`` (default 127.0.0.1:8081): gunicorn, in process,
like ``api``. The session cookie is ``Secure`` unless ``--insecure-cookie``
is given and the bind is loopback (a browser on the same machine, no TLS);
behind a TLS proxy keep the default.

``operators create --email E --role viewer|operator|admin [--password-stdin]``
prints a one-time password once (or reads one line from stdin);
``operators list [--json]``; ``operators disable --email E`` (sessions end
at once). Exit codes: 0 done, 1 refused by the data (a taken email, unknown
operator), 2 usage, 69 database unavailable, 78 configuration refused.
"""

from __future__ import annotations

import ipaddress
import logging
import sys

import click

from vpay.cli.common import connect_db, open_db, refuse
from vpay.cli.errors import Refused
from vpay.cli.output import echo_rows, json_option

log = logging.getLogger("vpay.cli")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--bind", default="127.0.0.1:8081", show_default=True,
              help="HOST:PORT to listen on (never the API's port).")
@click.option("--insecure-cookie", is_flag=True,
              help="Send the session cookie without Secure: only on a loopback bind without TLS.")
@click.option("--threads", type=int, default=4, show_default=True, help="Threads (at most 4: the pool).")
def console(bind: str, insecure_cookie: bool, threads: int) -> None:
    """The operator console: a web page for the human step (docs/console.md)."""
    from vpay.base import logs
    logs.setup(stream=sys.stdout)
    from vpay.api.server import HttpLimits, serve
    from vpay.base.settings import ConfigError
    from vpay.cli.api import _check_listen, _host_port
    from vpay.console import accounts
    from vpay.console.app import create_app
    listen = _host_port(bind)
    if insecure_cookie and (listen is None or not _loopback(listen[0])):
        refuse("--insecure-cookie only on a loopback bind (127.0.0.1, ::1): elsewhere the cookie needs TLS")
    if not 1 <= threads <= 4:
        refuse("--threads must be 1..4")
    try:
        limits = accounts.SessionLimits.from_env()
        # the API's slow-client defences (docs/security.md): a request reaches
        # a thread only once it has arrived whole
        http_limits = HttpLimits.from_env()
    except ConfigError as exc:
        refuse(str(exc))
    url, _ = open_db()

    def app_factory():
        return create_app(url, secure_cookie=not insecure_cookie, limits=limits)

    if listen is not None:
        _check_listen(*listen)
    log.info("console starting", extra={"bind": bind, "secure_cookie": not insecure_cookie})
    serve(app_factory, bind=[bind], workers=1, threads=threads, timeout=60, limits=http_limits,
          proc_name="vpay-console", loglevel=logging.getLevelName(logging.getLogger().level).lower())


@click.group()
def operators() -> None:
    """Who may sign in to the console, and with which role."""


@operators.command("create")
@click.option("--email", required=True)
@click.option("--role", required=True, type=click.Choice(["viewer", "operator", "admin"]))
@click.option("--password-stdin", is_flag=True, help="Read the password (one line, 12+ characters) from stdin.")
@json_option
def create(email: str, role: str, password_stdin: bool, as_json: bool) -> None:
    """Create an operator; without --password-stdin a one-time password is printed once."""
    from vpay.console import accounts
    from vpay.money.audit import audited
    password = sys.stdin.readline().rstrip("\r\n") if password_stdin else accounts.new_password()
    try:
        accounts.check_password(password)
    except accounts.Refused as exc:
        raise click.BadParameter(str(exc), param_hint="--password-stdin") from None
    with connect_db() as conn:
        try:
            with audited(conn, actor=None, action="operators.create", target=f"operator:{email}", note=role):
                row = accounts.create_operator(conn, email, role, password)
        except accounts.Refused as exc:
            raise Refused(str(exc)) from None
    echo_rows([row], ("id", "email", "role", "created_at"), as_json)
    if not password_stdin:
        click.echo(f"one-time password (shown once): {password}", err=True)


@operators.command("list")
@json_option
def list_(as_json: bool) -> None:
    """Operators, oldest first."""
    from vpay.console import accounts
    with connect_db() as conn:
        rows = accounts.list_operators(conn)
    echo_rows(rows, ("id", "email", "role", "created_at", "disabled_at"), as_json)


@operators.command("disable")
@click.option("--email", required=True)
@json_option
def disable(email: str, as_json: bool) -> None:
    """Disable an operator: no sign-in, every session ended now."""
    from vpay.console import accounts
    from vpay.money.audit import audited
    with connect_db() as conn:
        try:
            with audited(conn, actor=None, action="operators.disable", target=f"operator:{email}"):
                row = accounts.disable_operator(conn, email)
        except accounts.Refused as exc:
            raise Refused(str(exc)) from None
    echo_rows([row], ("id", "email", "role", "disabled_at"), as_json)
