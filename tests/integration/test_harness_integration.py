"""The test harness itself: where its embedded Postgres lives. The
integration half of tests/acceptance/test_harness.py (a killed run's server).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest


@pytest.mark.skipif(bool(os.environ.get("VPAY_TEST_DATABASE_URL", "").strip()),
                    reason="the suite uses the given server, not an embedded one")
def test_the_embedded_test_server_lives_outside_pytests_rotating_basetemp(server_url, tmp_path_factory, request):
    # pytest deletes all but the newest three numbered basetemp folders when a
    # session starts: a server inside one died with 51 errors mid-run when two
    # more sessions were started beside it. (A --basetemp given by hand is
    # not rotated, and is emptied at the start of its own session only.)
    socket_dir = Path(psycopg.conninfo.conninfo_to_dict(server_url)["host"]).resolve()
    basetemp = tmp_path_factory.getbasetemp().resolve()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        basetemp = basetemp.parent  # each xdist worker's basetemp sits in the session's
    rotating = basetemp if request.config.option.basetemp else basetemp.parent
    assert socket_dir.is_dir()
    assert rotating not in socket_dir.parents, (socket_dir, rotating)
