"""``vpay-server payments create|show``: start and inspect one payment (JSON out).

Both print ``payment_intent``, ``charge`` (the latest charge) and ``charges``
(every charge of the intent, oldest first): ``create`` printed ``charge``
and ``show`` printed ``charges`` before 0.5; both keys are kept so either
reader works. ``show`` adds ``events``, and on each charge its ``poll`` job
(next read, attempts, lane, last error; None once the poll has ended) and
its ``open_alerts``.

``create`` exits 0 once the rail holds the request (or declined it, or did
not answer: the worker carries on), 1 for a refusal by the data, 2 for bad
input, and 78 (EX_CONFIG) with one line when the rail refused OUR
configuration (wrong credentials, callback host, target environment,
currency setup): the payment is printed, failed with
``rail_configuration_refused``, and a ``rail_misconfigured`` alert is open.
Nothing is re-sent: wrong credentials fail fast, they do not loop.
"""

from __future__ import annotations

import json
import sys

import click

from vpay.cli.common import MINOR_UNITS, connect_db, open_db, refuse


@click.group()
def payments() -> None:
    """Start and inspect payments from a shell (JSON out)."""


@payments.command("create")
@click.option("--merchant", required=True, help="Merchant id.")
@click.option("--amount", required=True, type=MINOR_UNITS, help="Amount in minor units (e.g. 1050 = 10.50 EUR).")
@click.option("--currency", required=True, help="ISO 4217 code, e.g. EUR, XAF, UGX.")
@click.option("--rail", default="mtn", show_default=True, help="Rail code.")
@click.option("--payer", required=True, help="Payer MSISDN, international form, digits only.")
@click.option("--description", default=None, help="Shown to the payer (at most 160 characters).")
def payments_create(merchant, amount, currency, rail, payer, description) -> None:
    """Create and confirm a payment as the API would; print {payment_intent, charge, charges}."""
    from vpay.base.db import make_pool
    from vpay.money.charges import InvalidPayment
    from vpay.money.payments import create_and_submit
    from vpay.rails import build_rail
    from vpay.rails.port import RailError
    from vpay.base.settings import ConfigError, Settings
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        refuse(str(exc))
    url, _ = open_db()
    pool = make_pool(url, max_size=2)
    try:
        try:
            result = create_and_submit(pool, build_rail, merchant_id=merchant, amount=amount,
                                       currency=currency, rail=rail, payer=payer,
                                       description=description,
                                       prompt_ttl_seconds=settings.prompt_ttl_seconds)
        except InvalidPayment as exc:
            raise click.BadParameter(str(exc), param_hint=f"--{exc.param}") from None
        except RailError as exc:
            refuse(str(exc))
        click.echo(json.dumps(result | {"charges": [result["charge"]]}, indent=2))
        _refuse_if_misconfigured(pool, rail, result["charge"], result["payment_intent"]["id"])
    finally:
        pool.close()


def _refuse_if_misconfigured(pool, rail: str, charge: dict, intent_id: str) -> None:
    from vpay.money.misconfiguration import FAILURE_CODE, open_codes
    if charge["failure_code"] != FAILURE_CODE:
        return
    with pool.connection() as conn:
        codes = open_codes(conn, rail)
    refuse(f"rail {rail} refused our configuration ({', '.join(codes) or 'see the log'}); payment "
           f"{intent_id} failed with {FAILURE_CODE}, not sent to the payer: fix the VPAY_{rail.upper()}_* "
           f"settings (rail_misconfigured alert)")


@payments.command("show")
@click.argument("some_id")
def payments_show(some_id: str) -> None:
    """An intent (pi_...) or a charge (ch_...): its charges with their poll job
    and open alerts, and its events, as JSON."""
    from vpay.money.operator import payment_view
    with connect_db() as conn:
        found = payment_view(conn, some_id)
    if found is None:
        click.echo(f"vpay: no payment intent or charge {some_id!r}", err=True)
        sys.exit(1)
    click.echo(json.dumps(found, indent=2))
