"""``vpay-server webhooks``: manage merchants' webhook endpoints.

``add --merchant M --url U`` prints the endpoint with its new ``whsec_…``
secret, the only time the secret is shown; ``list``, ``disable``, ``enable``
and ``rotate-secret`` never print an old secret. A table by default, JSON
with ``--json`` (logs go to stderr). Exit codes: 0 done, 1 an unknown
endpoint or merchant (nothing changed), 2 usage error (a refused URL, a bad
flag), 69 database unavailable, 78 configuration refused.

URL policy: ``vpay.webhooks.check_url`` (https to public addresses only).
``VPAY_WEBHOOKS_ALLOW_PRIVATE=1`` lets http and loopback/private addresses
through, for development: it must be set both where the endpoint is added
(this command) and in the worker's environment, since every delivery checks
the URL again; a worker without it holds the endpoint.
"""

from __future__ import annotations

import click

from vpay.cli.common import Duration, connect_db
from vpay.cli.errors import NotFound, Refused
from vpay.cli.output import emit, json_option

COLUMNS = ("id", "merchant_id", "url", "enabled", "disabled_reason", "rotating", "created_at")

PRIVATE_HINT = ("; for development on loopback or a private network set VPAY_WEBHOOKS_ALLOW_PRIVATE=1 here "
                "and in the worker's environment (every delivery checks the URL again)")


def _wh():
    # Imported when a command runs, not when vpay-server starts.
    from vpay import webhooks
    return webhooks


def _found(row, endpoint_id: str):
    if row is None:
        raise NotFound(f"no webhook endpoint {endpoint_id!r}")
    return row


@click.group()
def webhooks() -> None:
    """Merchants' webhook endpoints (signed with Standard Webhooks)."""


@webhooks.command("add")
@click.option("--merchant", required=True, help="Merchant id.")
@click.option("--url", required=True,
              help="https URL resolving to public addresses (http and private addresses only "
                   "with VPAY_WEBHOOKS_ALLOW_PRIVATE=1, here and in the worker).")
@json_option
def add(merchant: str, url: str, as_json: bool) -> None:
    """Register an endpoint; print it with its secret (shown only this once)."""
    wh = _wh()
    try:
        with connect_db() as conn:
            endpoint = wh.add_endpoint(conn, merchant, url)
    except wh.UrlRefused as exc:
        text = str(exc)
        if not wh.allow_private() and "VPAY_WEBHOOKS_ALLOW_PRIVATE" in text:
            text += " (development only; set it here and in the worker's environment: every delivery checks the URL again)"
        elif not wh.allow_private() and ("loopback" in text or "private" in text):
            text += PRIVATE_HINT
        raise click.BadParameter(text, param_hint="--url") from None
    except wh.EndpointLimitReached as exc:
        raise Refused(f"{exc} (MAX_ENDPOINTS_PER_MERCHANT): remove one first") from None
    except LookupError as exc:
        raise NotFound(f"{exc}: create it with vpay-server merchants create --id {merchant}") from None
    emit(endpoint, as_json)
    click.echo("vpay: store the secret now; it is not shown again (rotate-secret makes a new one)",
               err=True)


@webhooks.command("list")
@click.option("--merchant", default=None, help="Only this merchant's endpoints.")
@json_option
def list_(merchant: str | None, as_json: bool) -> None:
    """Endpoints, without secrets."""
    with connect_db() as conn:
        rows = _wh().list_endpoints(conn, merchant)
        from vpay.money.merchants import merchant_exists
        if merchant is not None and not rows and not merchant_exists(conn, merchant):
            raise NotFound(f"no merchant {merchant!r}")
    emit(rows, as_json, COLUMNS)


@webhooks.command("disable")
@click.argument("endpoint_id")
@json_option
def disable(endpoint_id: str, as_json: bool) -> None:
    """Stop deliveries to an endpoint; its pending deliveries end unsent."""
    from vpay.money.audit import audited
    with connect_db() as conn, audited(conn, actor=None, action="webhooks.disable",
                                       target=f"endpoint:{endpoint_id}") as done:
        row = _wh().disable_endpoint(conn, endpoint_id, "disabled by an operator")
        done.result = "ok" if row else "refused: unknown endpoint"
    emit(_found(row, endpoint_id), as_json)


@webhooks.command("enable")
@click.argument("endpoint_id")
@json_option
def enable(endpoint_id: str, as_json: bool) -> None:
    """Deliver to an endpoint again. After a URL-policy hold, what waited is
    re-queued (printed as requeued); otherwise events from now on."""
    from vpay.money.audit import audited
    with connect_db() as conn, audited(conn, actor=None, action="webhooks.enable",
                                       target=f"endpoint:{endpoint_id}") as done:
        row = _wh().enable_endpoint(conn, endpoint_id)
        done.result = "ok" if row else "refused: unknown endpoint"
    emit(_found(row, endpoint_id), as_json)


@webhooks.command("redeliver")
@click.argument("event_id")
@click.option("--endpoint", "endpoint_id", required=True, help="The endpoint to send it to (we_...).")
@json_option
def redeliver(event_id: str, endpoint_id: str, as_json: bool) -> None:
    """Send an event to an endpoint again, due now (the retry schedule restarts).
    Exit 1: unknown event or endpoint, not the event's merchant's, disabled,
    or a delivery of it in flight."""
    from vpay.money.audit import audited
    with connect_db() as conn, audited(conn, actor=None, action="webhooks.redeliver",
                                       target=f"event:{event_id}", note=f"to {endpoint_id}") as done:
        job = _wh().redeliver(conn, event_id, endpoint_id)
        done.result = f"ok: job {job}" if job else "refused: unknown, disabled or in flight"
    if job is None:
        raise Refused(f"cannot redeliver {event_id!r} to {endpoint_id!r} (unknown, not its merchant's, "
                      "disabled, or a delivery in flight)")
    emit({"event": event_id, "endpoint": endpoint_id, "job": job}, as_json)


@webhooks.command("rotate-secret")
@click.argument("endpoint_id")
@click.option("--overlap-hours", "overlap", type=Duration(bare="h"), default="24h", show_default=True,
              help="How long the old secret keeps signing next to the new one (hours, or 30m, 2d); "
                   "0 revokes it now.")
@json_option
def rotate_secret(endpoint_id: str, overlap: float, as_json: bool) -> None:
    """Give an endpoint a new secret; print it (shown only this once)."""
    with connect_db() as conn:
        row = _found(_wh().rotate_secret(conn, endpoint_id, overlap), endpoint_id)
    emit(row, as_json)
    click.echo("vpay: store the secret now; it is not shown again", err=True)
