"""The test harness itself: where its embedded Postgres lives."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest


@pytest.mark.skipif(bool(os.environ.get("VPAY_TEST_DATABASE_URL", "").strip()),
                    reason="the suite uses the given server, not an embedded one")
def test_the_embedded_test_server_lives_outside_pytests_rotating_basetemp(server_url, tmp_path_factory):
    # pytest deletes all but the newest three numbered basetemp folders when a
    # session starts: a server inside one died with 51 errors mid-run when two
    # more sessions were started beside it.
    socket_dir = Path(psycopg.conninfo.conninfo_to_dict(server_url)["host"]).resolve()
    rotating = tmp_path_factory.getbasetemp().resolve().parent
    assert socket_dir.is_dir()
    assert rotating not in socket_dir.parents, (socket_dir, rotating)
