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

import click

from vpay.cli.common import MINOR_UNITS, connect_db, open_database, refuse
from vpay.cli.errors import NotFound
from vpay.cli.output import echo_record, emit, json_option

CHARGE_COLUMNS = ("id", "status", "rail", "amount", "currency", "failure_code", "next_read_at", "attempts",
                  "last_error", "open_alerts")
EVENT_COLUMNS = ("id", "type", "created")


@click.group()
def payments() -> None:
    """Start and inspect payments from a shell (a table, or JSON with --json)."""


@payments.command("create")
@click.option("--merchant", required=True, help="Merchant id.")
@click.option("--amount", required=True, type=MINOR_UNITS, help="Amount in minor units (e.g. 1050 = 10.50 EUR).")
@click.option("--currency", required=True, help="ISO 4217 code, e.g. EUR, XAF, UGX.")
@click.option("--rail", default="mtn", show_default=True, help="Rail code.")
@click.option("--payer", required=True, help="Payer MSISDN, international form, digits only.")
@click.option("--description", default=None, help="Shown to the payer (at most 160 characters).")
@json_option
def payments_create(merchant, amount, currency, rail, payer, description, as_json) -> None:
    """Create and confirm a payment as the API would; print {payment_intent, charge, charges}.

    An unknown merchant is exit 1 (nothing written); a malformed value 2."""
    from vpay.money.charges import InvalidPayment
    from vpay.money.payments import create_and_submit
    from vpay.rails import build_rail
    from vpay.rails.port import RailError
    from vpay.base.settings import ConfigError, Settings
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        refuse(str(exc))
    _, pool = open_database(pool_size=2)
    try:
        try:
            result = create_and_submit(pool, build_rail, merchant_id=merchant, amount=amount,
                                       currency=currency, rail=rail, payer=payer,
                                       description=description,
                                       prompt_ttl_seconds=settings.prompt_ttl_seconds)
        except InvalidPayment as exc:
            if exc.param == "merchant" and str(exc).startswith("unknown merchant"):
                raise NotFound(f"{exc}: create it with vpay-server merchants create --id {merchant}") from None
            raise click.BadParameter(str(exc), param_hint=f"--{exc.param}") from None
        except RailError as exc:
            refuse(str(exc))
    finally:
        pool.close()
    refused = result.pop("rail_refusal", None)
    result["charges"] = [result["charge"]]
    show_payment(result, as_json)
    if refused is not None:
        refuse(f"rail {rail} refused our configuration ({refused['code']}); payment "
               f"{result['payment_intent']['id']} failed with rail_configuration_refused, not sent to the "
               f"payer: fix the VPAY_{rail.upper()}_* settings (rail_misconfigured alert)")


def show_payment(found: dict, as_json: bool) -> None:
    """A payment as JSON, or for a person: the intent's fields, then its
    charges (with their poll: the next read, attempts, last rail answer;
    none once the charge is settled) and its events."""
    if as_json:
        emit(found, True)
        return
    intent = found["payment_intent"]
    charges = [{**c, **{k: (c.get("poll") or {}).get(k) for k in ("next_read_at", "attempts", "last_error")},
                "open_alerts": len(c.get("open_alerts") or [])} for c in found["charges"]]
    tables = {"charges": (charges, CHARGE_COLUMNS)}
    if "events" in found:
        tables["events"] = (found["events"], EVENT_COLUMNS)
    echo_record(intent, [k for k, v in intent.items() if not isinstance(v, (dict, list))], tables)


@payments.command("show")
@click.argument("some_id")
@json_option
def payments_show(some_id: str, as_json: bool) -> None:
    """An intent (pi_...) or a charge (ch_...): its charges with their poll job
    and open alerts, and its events. Exit 1 when the id names nothing."""
    from vpay.money.operator import payment_view
    with connect_db() as conn:
        found = payment_view(conn, some_id)
    if found is None:
        raise NotFound(f"no payment intent or charge {some_id!r}")
    show_payment(found, as_json)

