"""The hourly sweep's retention against a real Postgres. The integration half
of tests/acceptance/test_operator_cli.py (the operator's commands).
"""

from __future__ import annotations

import pytest

from vpay.engine import queue
from vpay.handlers import Context
from vpay.handlers.sweep import sweep
from vpay.base.settings import Settings
# helpers kept in tests/acceptance/test_operator_cli.py
from test_operator_cli import _age_everything, _payment


@pytest.mark.parametrize("days, pruned", [(30, True), (0, False)])
def test_the_hourly_sweep_prunes_by_retention_days_and_zero_keeps_everything(db, pool, merchant, days, pruned):
    _payment(db, merchant, "succeeded")
    db.execute("DELETE FROM jobs")
    _age_everything(db, 40)
    queue.enqueue(db, "sweep", "sweep:expired")
    job = queue.claim(db, "w")
    sweep(job, Context(pool=pool, worker_id="w", settings=Settings(retention_days=days)))
    left = db.execute("SELECT count(*) FROM events").fetchone()[0]
    assert left == (0 if pruned else 2)
