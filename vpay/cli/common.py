"""What every command shares: exit codes, the one-line refusal, the database URL.

Exit codes (contract): 0 done, 1 not found / refused by the data, 2 usage,
69 database unreachable (EX_UNAVAILABLE), 78 configuration refused (EX_CONFIG).
"""

from __future__ import annotations

import sys

import click

EX_UNAVAILABLE = 69
EX_CONFIG = 78


def refuse(message: str) -> None:
    """One clear line, then exit 78: systemd will not restart a refused config
    (RestartPreventExitStatus=78)."""
    click.echo(f"vpay: configuration refused: {message}", err=True)
    sys.exit(EX_CONFIG)


def open_db(pool_size: int | None = None):
    """``(url, pool)``: the database URL (``VPAY_DATABASE_URL`` or the embedded
    default) and, when ``pool_size`` is given, a pool of that size. A bad
    setting exits 78 with one line."""
    from ..db import ConfigError, database_url, make_pool
    try:
        url = database_url()
    except ConfigError as exc:
        refuse(str(exc))
    if pool_size is None:
        return url, None
    return url, make_pool(url, max_size=pool_size)
