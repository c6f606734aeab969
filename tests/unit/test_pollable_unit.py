"""Charges and refunds are registrations of the one poll body
(vpay/money/pollable.py). The unit half of tests/integration/test_pollable.py (a toy
payout polled to its end by the shared code).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from vpay import handlers
from vpay.money import charges, refunds
from vpay.engine import queue
from vpay.handlers import polling
from vpay.engine.outcome import Done


def _job(kind: str, payload: dict) -> queue.Job:
    now = datetime.now(timezone.utc)
    return queue.Job(id=1, kind=kind, dedupe_key=f"{kind}:x", payload=payload, attempts=1, failures=0,
                     lease_token=uuid.uuid4(), worker="w1", run_at=now, created_at=now)


@pytest.mark.parametrize("kind,described", [("poll", charges.CHARGES), ("refund_poll", refunds.REFUNDS)])
def test_charge_and_refund_polls_are_registrations_of_the_one_body(monkeypatch, kind, described):
    seen = []

    def spy(p, job, ctx):
        seen.append((p, job.kind))
        return Done("through the shared body")

    monkeypatch.setattr(polling, "poll_once", spy)
    outcome = handlers.handle(_job(kind, {described.payload_key: "x"}), ctx=None)
    assert outcome == Done("through the shared body")
    assert seen == [(described, kind)]
    assert described.kind == kind
