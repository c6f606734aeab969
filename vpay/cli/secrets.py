"""``vpay-server secrets new-key|rotate``: the keys webhook secrets are sealed under.

``new-key`` prints a fresh Fernet key (for ``VPAY_SECRET_KEYS``). ``rotate``
re-seals every stored webhook secret (current and previous) under the newest
key of ``VPAY_SECRET_KEYS`` and seals any still in plaintext; resumable (run
it again after a crash: rows already under the newest key are skipped), one
audit line. Output is JSON on stdout. Exit codes: 0 done, 69 database
unavailable, 78 no keys, a malformed key, or a stored secret that no key
opens (nothing of that row written). docs/security.md, "Rotating the keys".
"""

from __future__ import annotations

import getpass

import click

from vpay.cli.common import connect_db
from vpay.cli.output import emit, json_option


@click.group()
def secrets() -> None:
    """The keys webhook secrets are stored sealed under (VPAY_SECRET_KEYS)."""


@secrets.command("new-key")
@json_option
def new_key(as_json: bool) -> None:
    """Print a fresh Fernet key (put it first in VPAY_SECRET_KEYS); the key
    alone on its line, or ``{"key": …}`` with --json."""
    from vpay.base.secretbox import new_key as make
    key = make()
    if as_json:
        emit({"key": key}, True)
    else:
        click.echo(key)


@secrets.command("rotate")
@click.option("--actor", default=None, help="Who runs it, for the audit line (default: the OS user).")
@json_option
def rotate(actor: str | None, as_json: bool) -> None:
    """Re-seal every webhook secret under the newest key (resumable)."""
    if actor is not None and not actor.strip():
        raise click.BadParameter("give who runs it, or leave --actor out for the OS user",
                                 param_hint="'--actor'")
    from vpay.base import secretbox
    from vpay.webhooks import sealing
    box = secretbox.default()  # ConfigError: exit 78 before the database
    with connect_db() as conn:
        counts = sealing.rotate(conn, box, actor=actor or getpass.getuser())
    emit(counts, as_json)
