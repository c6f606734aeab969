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
import json

import click

from vpay.cli.common import open_db


@click.group()
def secrets() -> None:
    """The keys webhook secrets are stored sealed under (VPAY_SECRET_KEYS)."""


@secrets.command("new-key")
def new_key() -> None:
    """Print a fresh Fernet key (put it first in VPAY_SECRET_KEYS)."""
    from vpay.base.secretbox import new_key as make
    click.echo(make())


@secrets.command("rotate")
@click.option("--actor", default=None, help="Who runs it, for the audit line (default: the OS user).")
def rotate(actor: str | None) -> None:
    """Re-seal every webhook secret under the newest key (resumable)."""
    from vpay.base import secretbox
    from vpay.base.db import connect
    from vpay.webhooks import sealing
    box = secretbox.default()  # ConfigError: exit 78 before the database
    url, _ = open_db()
    with connect(url) as conn:
        counts = sealing.rotate(conn, box, actor=actor or getpass.getuser())
    click.echo(json.dumps(counts))
