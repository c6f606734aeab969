"""vpay.base.metrics and vpay.base.logs in process: the job context on log lines, the
rail adapters' counted, timed and structured calls (HTTP faked with
``responses``), the outcome labels, and the database collector without a
database. Live processes are in tests/acceptance/test_observability.py."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from types import SimpleNamespace

import pytest
import responses

from vpay.base import logs, metrics
from vpay.money import gauges
from vpay.engine.outcome import DeadLetter, Done, RetryAfter
from vpay.rails.mtn import MtnMomo
from vpay.rails.orange import OrangeMoney
from vpay.rails.port import ChargeRequest, RefundRequest

BASE = "https://momo.test"
REFERENCE = "3f2c1b7e-9a4d-4c2e-8f1a-5b6d7e8f9a0b"
SUBSCRIPTION_KEY, API_USER, API_KEY = "subkey-SECRET-1111", "apiuser-SECRET-2222", "apikey-SECRET-3333"
ACCESS_TOKEN = "token-SECRET-4444"
CHARGE = ChargeRequest(charge_id="ch_123", rail_reference=REFERENCE, amount=1050, currency="EUR",
                       payer="46733123454")


@pytest.fixture
def captured():
    """vpay's real log setup, writing to a buffer; the root logger restored after."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    buf = io.StringIO()
    logs.setup("DEBUG", buf)
    yield lambda: [json.loads(line) for line in buf.getvalue().splitlines()]
    root.handlers[:], level = saved
    root.setLevel(level)


def _job(**kw):
    base = dict(id=42, kind="poll", lane="mtn", dedupe_key="poll:ch_123",
                payload={"charge_id": "ch_123", "other": "x"})
    return SimpleNamespace(**(base | kw))


# --- logs ----------------------------------------------------------------------


def test_lines_inside_a_job_carry_its_fields_and_lines_outside_do_not(captured):
    log = logging.getLogger("vpay.somewhere")
    with logs.job_context(_job(), "host:1"):
        log.info("inside")
        log.info("explicit", extra={"kind": "override"})
    log.info("outside")
    inside, explicit, outside = captured()
    assert {k: inside[k] for k in ("worker_id", "job_id", "kind", "lane", "dedupe_key", "charge_id")} == {
        "worker_id": "host:1", "job_id": 42, "kind": "poll", "lane": "mtn",
        "dedupe_key": "poll:ch_123", "charge_id": "ch_123"}
    assert "other" not in inside and "refund_id" not in inside
    assert explicit["kind"] == "override" and explicit["job_id"] == 42
    assert "job_id" not in outside and "worker_id" not in outside


def test_a_line_looks_up_no_thread_or_process_and_keeps_its_stack_and_traceback(captured):
    """No field of a line names them: setup turns off their per-record lookup
    (the logging HOWTO, "Optimization"); ``stack_info`` and ``exc_info``
    still reach the line (a fresh-clone review found ``stack_info`` lost when
    the caller's frame was not looked up)."""
    records = []
    keep = logging.Filter()
    keep.filter = lambda record: records.append(record) or True
    logging.getLogger().handlers[0].addFilter(keep)
    log = logging.getLogger("vpay.somewhere")
    log.info("one line", extra={"charge_id": "ch_1"})
    log.warning("where am I", stack_info=True)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it broke")
    one, where, broke = captured()
    assert (records[0].threadName, records[0].processName, records[0].process) == (None, None, None)
    assert {"time", "level", "logger", "message", "charge_id"} <= set(one)
    assert "test_a_line_looks_up_no_thread_or_process" in where["stack_info"]
    assert "ValueError: boom" in broke["exc_info"]


def test_a_lines_time_reads_as_loggings_own_and_is_made_once_a_second(monkeypatch):
    formatter, plain = logs.JsonLines(), logging.Formatter()
    records = []
    for created in (1_765_000_000.0, 1_765_000_000.5, 1_765_000_000.999, 1_765_000_001.001,
                    1_765_000_001.7, 1_765_003_600.25):
        record = logging.LogRecord("vpay.x", logging.INFO, __file__, 1, "m", None, None)
        record.created, record.msecs = created, int((created - int(created)) * 1000)
        records.append(record)
    expected = [plain.formatTime(r) for r in records]
    made = []
    real = time.strftime
    monkeypatch.setattr(time, "strftime", lambda fmt, t: made.append(fmt) or real(fmt, t))
    assert [formatter.formatTime(r) for r in records] == expected
    assert len(made) == 3  # one per second seen, not one per line
    assert formatter.formatTime(records[0], "%H") == plain.formatTime(records[0], "%H")
    formatter.default_msec_format = plain.default_msec_format = None  # logging's way to leave them out
    assert formatter.formatTime(records[0]) == plain.formatTime(records[0])


def test_the_context_is_per_thread(captured):
    log = logging.getLogger("vpay.somewhere")
    entered, logged = threading.Event(), threading.Event()

    def other():
        entered.wait(5)
        log.info("other thread")
        logged.set()

    t = threading.Thread(target=other)
    t.start()
    with logs.job_context(_job(payload={"refund_id": "re_1", "charge_id": "ch_9"}), "host:1"):
        entered.set()
        logged.wait(5)
        log.info("this thread")
    t.join(5)
    lines = {l["message"]: l for l in captured()}
    assert "job_id" not in lines["other thread"]
    assert lines["this thread"]["refund_id"] == "re_1" and lines["this thread"]["charge_id"] == "ch_9"


# --- rail calls ----------------------------------------------------------------


def _sample(name, **labels):
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def _mtn():
    return MtnMomo(base_url=BASE, subscription_key=SUBSCRIPTION_KEY, api_user=API_USER, api_key=API_KEY,
                   sleep=lambda s: None)


@responses.activate
def test_a_rail_call_is_counted_timed_and_logged_with_structured_fields_and_no_secret(captured):
    responses.post(f"{BASE}/collection/token/", json={"access_token": ACCESS_TOKEN, "expires_in": 3600})
    responses.get(f"{BASE}/collection/v1_0/requesttopay/{REFERENCE}",
                  json={"status": "SUCCESSFUL", "amount": "10.50", "currency": "EUR",
                        "financialTransactionId": "363440463"})
    responses.get(f"{BASE}/collection/v1_0/requesttopay/{REFERENCE}", status=500)
    before_ok = _sample("vpay_rail_requests_total", rail="mtn", operation="status", answer="succeeded")
    before_no = _sample("vpay_rail_requests_total", rail="mtn", operation="status", answer="no_answer")
    before_n = _sample("vpay_rail_request_seconds_count", rail="mtn", operation="status")
    rail = _mtn()
    with logs.job_context(_job(), "host:1"):
        assert rail.status(CHARGE).kind.value == "succeeded"
        assert rail.status(CHARGE).kind.value == "no_answer"
    assert _sample("vpay_rail_requests_total", rail="mtn", operation="status",
                   answer="succeeded") == before_ok + 1
    assert _sample("vpay_rail_requests_total", rail="mtn", operation="status",
                   answer="no_answer") == before_no + 1
    assert _sample("vpay_rail_request_seconds_count", rail="mtn", operation="status") == before_n + 2
    lines = captured()
    calls = [l for l in lines if l["message"] == "rail call"]
    assert [(l["answer"], l["http_status"], l["level"]) for l in calls] == [
        ("succeeded", 200, "INFO"), ("no_answer", 500, "WARNING")]
    for line in calls:
        assert line["rail"] == "mtn" and line["operation"] == "status" and line["sent"] is True
        assert isinstance(line["seconds"], float) and line["charge_id"] == "ch_123"
        assert line["rail_reference"] == REFERENCE   # the request's identifiers, for the adapter's lines it replaced
    text = json.dumps(lines)
    for secret in (SUBSCRIPTION_KEY, API_USER, API_KEY, ACCESS_TOKEN):
        assert secret not in text


def test_an_answer_made_without_a_request_is_logged_but_not_counted(captured):
    orange = OrangeMoney(base_url="https://orange.test", client_id="cid", client_secret="csecret",
                         merchant_key="mkey", country="dev", notif_url="https://h.test/n",
                         return_url="https://h.test/r", cancel_url="https://h.test/c")
    refund = RefundRequest(refund_id="re_1", rail_reference=REFERENCE, charge_rail_reference=REFERENCE,
                           amount=100, currency="XOF", payer="2250700000000")
    before = _sample("vpay_rail_requests_total", rail="orange", operation="refund", answer="rejected")
    assert orange.refund(refund).kind.value == "rejected"
    assert _sample("vpay_rail_requests_total", rail="orange", operation="refund",
                   answer="rejected") == before
    (line,) = [l for l in captured() if l["message"] == "rail call"]
    assert line["sent"] is False and line["answer"] == "rejected"


def test_a_rail_method_that_raises_is_counted_as_error_and_still_raises():
    before = _sample("vpay_rail_requests_total", rail="mtn", operation="status", answer="error")
    bad = ChargeRequest(charge_id="ch_1", rail_reference=REFERENCE, amount=1, currency="EUR", payer="1")

    rail = _mtn()
    # a bug inside the adapter (here: its session is gone) must surface, and be counted
    rail._session = None
    with pytest.raises(AttributeError):
        rail.status(bad)
    assert _sample("vpay_rail_requests_total", rail="mtn", operation="status", answer="error") == before + 1


# --- the loop's labels and counters --------------------------------------------


def test_outcome_labels():
    assert metrics.outcome_label(Done(), True) == "done"
    assert metrics.outcome_label(RetryAfter(10), True) == "retry"
    assert metrics.outcome_label(DeadLetter("x"), True) == "dead_letter"
    assert metrics.outcome_label(None, True) == "error"
    assert metrics.outcome_label(Done(), False) == "lost"
    assert metrics.outcome_label(Done(), None) == "unrecorded"


def test_lateness_is_observed_for_status_reads_only():
    # late_by is the claim's now() minus run_at, on the database's clock
    before = _sample("vpay_poll_lateness_seconds_count", lane="mtn")
    before_sum = _sample("vpay_poll_lateness_seconds_sum", lane="mtn")
    low = _sample("vpay_poll_lateness_seconds_bucket", lane="mtn", le="0.1")
    metrics.job_claimed(_job(late_by=7.0))
    metrics.job_claimed(_job(kind="deliver", lane="mtn", late_by=7.0))
    assert _sample("vpay_poll_lateness_seconds_count", lane="mtn") == before + 1
    assert _sample("vpay_poll_lateness_seconds_sum", lane="mtn") - before_sum == 7.0
    assert _sample("vpay_poll_lateness_seconds_bucket", lane="mtn", le="0.1") == low
    # never negative, whatever a hand-built job says
    metrics.job_claimed(_job(late_by=-3.0))
    assert _sample("vpay_poll_lateness_seconds_bucket", lane="mtn", le="0.1") == low + 1
    assert _sample("vpay_poll_lateness_seconds_sum", lane="mtn") - before_sum == 7.0


def test_a_rebalance_counts_the_jobs_it_put_over_share_by_lane():
    before = _sample("vpay_jobs_over_share_total", lane="orange")
    metrics.lane_rebalanced("orange", 3)
    metrics.lane_rebalanced("orange", 0)
    assert _sample("vpay_jobs_over_share_total", lane="orange") == before + 3


def test_without_a_database_the_collector_says_so_and_reports_no_numbers():
    families = {f.name: f for f in gauges.DatabaseCollector().collect()}
    assert [s.value for s in families["vpay_database_up"].samples] == [0]
    for name in ("vpay_queue_jobs", "vpay_alerts_open", "vpay_charges", "vpay_webhook_endpoints_disabled"):
        assert families[name].samples == []
