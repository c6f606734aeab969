"""The benches' databases: the server they run on and a fresh, migrated database.

``server()`` is ``VPAY_DATABASE_URL`` when set, otherwise the embedded Postgres
under ``./.vpay-bench`` (``VPAY_DATA_DIR`` if set). ``fresh(server, name,
extra_sql)`` drops ``name`` if it exists (only bench-named databases are passed
here), creates and migrates it, runs ``extra_sql`` (a bench's own table or
trigger), and answers its URL.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
from psycopg import sql

HERE = Path(__file__).resolve().parent


def server() -> str:
    """The libpq URL of the server the bench runs on."""
    from vpay.base.db import database_url
    os.environ.setdefault("VPAY_DATA_DIR", str(HERE.parent / ".vpay-bench"))
    return database_url()


def fresh(server_url: str, name: str, extra_sql: str | None = None) -> str:
    """A new database ``name`` on ``server_url``, migrated; answers its URL."""
    from vpay.base.db import migrate
    admin = psycopg.conninfo.make_conninfo(server_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        if extra_sql:
            conn.execute(extra_sql)
    return url
