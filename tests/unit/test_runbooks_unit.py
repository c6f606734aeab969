"""Every fenced block of docs/runbooks/*.md is run by a scenario and has no
placeholder. The unit half of tests/acceptance/test_runbooks.py, which runs
the blocks against a live deployment.
"""

from __future__ import annotations

import re

import test_runbooks  # the scenarios and the block reader: tests/acceptance/test_runbooks.py
from test_runbooks import runbook_blocks


PLACEHOLDER = re.compile(r"\$\d|…|\.\.\.|<[a-z_ ]+>|\bch_…|\bpi_…")

# (runbook, section) → the test that produces its situation and runs its blocks
COVERED = {
    ("worker-queue.md", "Is the fleet healthy?"): "test_fleet_health",
    ("worker-queue.md", "A dead-lettered job"): "test_a_dead_lettered_delivery_is_found_and_retried",
    ("worker-queue.md", "A stranded lease"): "test_a_killed_workers_stranded_lease_is_found_and_released",
    ("worker-queue.md", "A rail contradicting a settled charge"):
        "test_a_contradiction_is_found_and_acknowledged",
    ("worker-queue.md", "A paused rail"): "test_a_rail_paused_by_a_429_is_shown_with_why_and_by_whom",
    ("worker-queue.md", "What is kept, and for how long"): "test_the_retention_dry_run_counts_what_would_go",
    ("dead-worker.md", "Is a worker dead?"): "test_a_dead_worker_is_found_and_its_lease_freed",
    ("dead-worker.md", "Its leases"): "test_a_dead_worker_is_found_and_its_lease_freed",
    ("unresolved-charges.md", ""):
        "test_an_unresolved_charge_is_found_reconciled_against_the_statement_and_acknowledged",
}


# ---- the runbooks as documents ---------------------------------------------

def test_every_runbook_block_is_run_by_a_scenario_and_has_no_placeholder():
    blocks = runbook_blocks()
    assert {(f, h) for f, h, _, _ in blocks} == set(COVERED)
    for name in COVERED.values():
        assert hasattr(test_runbooks, name), name  # a scenario of that name exists
    for f, h, lang, text in blocks:
        assert not PLACEHOLDER.search(text), (f, h, text)
