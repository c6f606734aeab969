"""``vpay-server webhooks``: manage merchants' webhook endpoints.

``add --merchant M --url U`` prints the endpoint with its new ``whsec_…``
secret, the only time the secret is shown; ``list``, ``disable``, ``enable``
and ``rotate-secret`` never print an old secret. Output is JSON on stdout
(logs go to stderr). Exit codes: 0 done, 1 unknown endpoint, 2 usage
error (a refused URL or an unknown merchant), 78 configuration refused.
URL policy: ``vpay.webhooks.check_url`` (https to public addresses only,
unless ``VPAY_WEBHOOKS_ALLOW_PRIVATE=1``).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

import click

from vpay.cli.common import open_db


def _wh():
    # Imported when a command runs, not when vpay-server starts.
    from vpay import webhooks
    return webhooks


def _connect():
    from vpay.base.db import connect
    return connect(open_db()[0])


def _echo(doc) -> None:
    def default(value):
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"not JSON: {type(value).__name__}")
    click.echo(json.dumps(doc, indent=2, default=default))


def _unknown(endpoint_id: str) -> None:
    click.echo(f"vpay: no webhook endpoint {endpoint_id!r}", err=True)
    sys.exit(1)


@click.group()
def webhooks() -> None:
    """Merchants' webhook endpoints (signed with Standard Webhooks)."""


@webhooks.command("add")
@click.option("--merchant", required=True, help="Merchant id.")
@click.option("--url", required=True,
              help="https URL resolving to public addresses (http and private addresses only "
                   "with VPAY_WEBHOOKS_ALLOW_PRIVATE=1).")
def add(merchant: str, url: str) -> None:
    """Register an endpoint; print it with its secret (shown only this once)."""
    wh = _wh()
    try:
        with _connect() as conn:
            endpoint = wh.add_endpoint(conn, merchant, url)
    except wh.UrlRefused as exc:
        raise click.BadParameter(str(exc), param_hint="--url") from None
    except LookupError as exc:
        raise click.BadParameter(str(exc), param_hint="--merchant") from None
    _echo(endpoint)
    click.echo("vpay: store the secret now; it is not shown again (rotate-secret makes a new one)",
               err=True)


@webhooks.command("list")
@click.option("--merchant", default=None, help="Only this merchant's endpoints.")
def list_(merchant: str | None) -> None:
    """Endpoints as JSON, without secrets."""
    with _connect() as conn:
        _echo(_wh().list_endpoints(conn, merchant))


@webhooks.command("disable")
@click.argument("endpoint_id")
def disable(endpoint_id: str) -> None:
    """Stop deliveries to an endpoint; its pending deliveries end unsent."""
    from vpay.money.audit import audited
    with _connect() as conn, audited(conn, actor=None, action="webhooks.disable",
                                     target=f"endpoint:{endpoint_id}") as done:
        row = _wh().disable_endpoint(conn, endpoint_id, "disabled by an operator")
        done.result = "ok" if row else "refused: unknown endpoint"
    if row is None:
        _unknown(endpoint_id)
    _echo(row)


@webhooks.command("enable")
@click.argument("endpoint_id")
def enable(endpoint_id: str) -> None:
    """Deliver to an endpoint again. After a URL-policy hold, what waited is
    re-queued (printed as requeued); otherwise events from now on."""
    from vpay.money.audit import audited
    with _connect() as conn, audited(conn, actor=None, action="webhooks.enable",
                                     target=f"endpoint:{endpoint_id}") as done:
        row = _wh().enable_endpoint(conn, endpoint_id)
        done.result = "ok" if row else "refused: unknown endpoint"
    if row is None:
        _unknown(endpoint_id)
    _echo(row)


@webhooks.command("redeliver")
@click.argument("event_id")
@click.option("--endpoint", "endpoint_id", required=True, help="The endpoint to send it to (we_...).")
def redeliver(event_id: str, endpoint_id: str) -> None:
    """Send an event to an endpoint again, due now (the retry schedule restarts)."""
    from vpay.money.audit import audited
    with _connect() as conn, audited(conn, actor=None, action="webhooks.redeliver",
                                     target=f"event:{event_id}", note=f"to {endpoint_id}") as done:
        job = _wh().redeliver(conn, event_id, endpoint_id)
        done.result = f"ok: job {job}" if job else "refused: unknown, disabled or in flight"
    if job is None:
        click.echo(f"vpay: cannot redeliver {event_id!r} to {endpoint_id!r} (unknown, not its merchant's, "
                   "disabled, or a delivery in flight)", err=True)
        sys.exit(1)
    _echo({"event": event_id, "endpoint": endpoint_id, "job": job})


@webhooks.command("rotate-secret")
@click.argument("endpoint_id")
@click.option("--overlap-hours", type=click.FloatRange(min=0), default=24.0, show_default=True,
              help="How long the old secret keeps signing next to the new one; 0 revokes it now.")
def rotate_secret(endpoint_id: str, overlap_hours: float) -> None:
    """Give an endpoint a new secret; print it (shown only this once)."""
    with _connect() as conn:
        row = _wh().rotate_secret(conn, endpoint_id, overlap_hours * 3600.0)
    if row is None:
        _unknown(endpoint_id)
    _echo(row)
    click.echo("vpay: store the secret now; it is not shown again", err=True)
