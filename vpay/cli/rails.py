"""``vpay-server rails list``: every known rail, whether this environment
configures it, and its backpressure pause as every process honours it (table
``rail_pauses``: the last pause a rail's 429/503 ``Retry-After`` asked for,
in force or over; vpay/rails/pauses.py).

A table by default, JSON with ``--json`` (``configuration_error`` names what
a half-configured rail lacks, never a value). Exit codes: 0 done, 2 usage,
69 database unavailable, 78 configuration refused.
"""

from __future__ import annotations

import click

from vpay.cli.common import connect_db
from vpay.cli.output import echo_rows, json_option

COLUMNS = ("rail", "configured", "paused", "paused_until", "seconds_left", "reason", "set_by", "set_at")


@click.group()
def rails() -> None:
    """Rails: configured here, and paused for every process."""


@rails.command("list")
@json_option
def list_(as_json: bool) -> None:
    """Every known rail: configured in this environment, and its pause
    (until when, why, set by which process; the last one when over)."""
    from vpay.rails.pauses import board
    from vpay.rails.port import KNOWN_RAILS
    with connect_db() as conn:
        pauses = board(conn)
    rows = []
    for code in KNOWN_RAILS:
        configured, problem = _configured(code)
        pause = pauses.get(code) or {}
        rows.append({"rail": code, "configured": configured, "configuration_error": problem,
                     "paused": bool(pause.get("in_force")), "paused_until": pause.get("paused_until"),
                     "seconds_left": round(pause.get("seconds_left") or 0.0, 1),
                     "reason": pause.get("reason"), "set_by": pause.get("set_by"),
                     "set_at": pause.get("set_at")})
    echo_rows(rows, COLUMNS, as_json)


def _configured(code: str) -> tuple[bool, str | None]:
    """Whether ``code``'s settings (``VPAY_<RAIL>_*``, environment or
    credentials) are present and build its adapter, and what is wrong when
    some are present but they do not."""
    from vpay.base.credentials import WithCredentials
    from vpay.rails import build_rail
    from vpay.rails.port import RailError
    env = WithCredentials()
    prefix = f"VPAY_{code.upper()}_"
    if not any(k.startswith(prefix) and v.strip() for k, v in env.items()):
        return False, None
    try:
        build_rail(code)
    except RailError as exc:
        return False, str(exc)
    return True, None
