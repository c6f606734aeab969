"""The chaos run's invariants, as pure functions over a snapshot.

A snapshot is plain data (JSON-ready dicts and lists; ``bench/chaos.py``
reads it from the database, the rail's ledger and the receivers once the run
is quiet), so the checks import neither vpay nor a database driver and a
test can plant a violation in a snapshot and see it caught. Keys:

* ``charges``: ``[{id, payment_intent_id, rail_reference, amount, currency,
  status, failure_code, rail_transaction_id, prompt_expired}]`` (amounts in
  minor units);
* ``intents``: ``[{id, merchant_id, status}]``;
* ``events``: ``[{id, type, payment_intent_id, charge_id, refund_id, expired}]``;
* ``refunds``: ``[{id, charge_id, rail_reference, amount, status, failure_code}]``;
* ``jobs``: ``[{kind, dedupe_key, dead, leased}]`` (``dead``: ``run_at = 'infinity'``);
* ``alerts``: ``[{kind, charge_id, refund_id}]``;
* ``audit``: every status change as the database committed it, or ``None``
  when not recorded: ``[{tbl, row_id, old_status, new_status, what}]``
  (``what``: ``insert``, ``status``, ``prompt_expired``);
* ``endpoints``: ``[{id, merchant_id}]``;
* ``rail``: the rail's ledger, ``{"transactions": {reference: {status,
  reason, amount, transaction_id}}, "refunds": {...}}`` (amounts: major-unit
  strings; ``transaction_id``: the rail's financialTransactionId);
* ``delivered``: ``{endpoint_id: [event ids the receiver verified]}``;
* ``bad_signatures``: ``[{endpoint_id, error}]``;
* ``quiescent``: whether the run went quiet before its deadline, and
  ``unquiet``: what was still moving if not.

Every check answers a list of violations ``{check, id, detail}``;
``run_all`` runs them all. The invariants come from issue 12 ("A chaos
run"), the design page ("The job queue", "Timers assert nothing") and the
money state machine (vpay/money/charges.py, vpay/money/pollable.py).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterable

Snapshot = dict[str, Any]
Violation = dict[str, Any]

TERMINAL = frozenset({"succeeded", "failed"})
LIVE = frozenset({"pending", "unresolved"})
ALLOWED = {
    # charges and refunds: pending → terminal | unresolved; unresolved → terminal
    "charges": {("pending", "succeeded"), ("pending", "failed"), ("pending", "unresolved"),
                ("unresolved", "succeeded"), ("unresolved", "failed")},
    "refunds": {("pending", "succeeded"), ("pending", "failed"), ("pending", "unresolved"),
                ("unresolved", "succeeded"), ("unresolved", "failed")},
    "payment_intents": {("requires_confirmation", "processing"), ("processing", "succeeded"),
                        ("processing", "requires_payment_method"), ("processing", "canceled"),
                        ("requires_confirmation", "canceled")},
}
BORN = {"charges": {"pending"}, "refunds": {"pending"},
        "payment_intents": {"processing", "requires_confirmation"}}
INTENT_TERMINAL = frozenset({"succeeded", "requires_payment_method", "canceled"})
NOT_FINAL_REASONS = frozenset({"ONGOING", "PAYER_DELAYED"})  # MoMo: FAILED on the wire, not final
UNSUBMITTED_CODES = ("not_submitted",)
"""Failure codes that may end an operation the rail never recorded (the
resubmit job: the prompt ran out and the rail still does not know it)."""
EXPONENT = 2  # EUR (MoMo), KES (M-Pesa), ZMW (pawaPay): all of exponent 2


def _v(check: str, ident: Any, detail: str, **more: Any) -> Violation:
    return {"check": check, "id": ident, "detail": detail, **more}


def _minor(major: Any, exponent: int = EXPONENT) -> int | None:
    try:
        value = Decimal(str(major)) * (10 ** exponent)
    except (InvalidOperation, ValueError):
        return None
    return int(value) if value == value.to_integral_value() else None


def _status_changes(snap: Snapshot) -> list[dict[str, Any]] | None:
    audit = snap.get("audit")
    return None if audit is None else [a for a in audit if a["what"] in ("insert", "status")]


def check_terminal_once(snap: Snapshot) -> list[Violation]:
    """At most one terminal transition per charge, refund and intent."""
    changes = _status_changes(snap)
    if changes is None:
        return []
    count: Counter = Counter()
    for a in changes:
        terminal = INTENT_TERMINAL if a["tbl"] == "payment_intents" else TERMINAL
        if a["what"] == "status" and a["new_status"] in terminal:
            count[(a["tbl"], a["row_id"])] += 1
    return [_v("terminal_once", row_id, f"{tbl} row reached a terminal status {n} times")
            for (tbl, row_id), n in sorted(count.items()) if n > 1]


def check_no_backwards(snap: Snapshot) -> list[Violation]:
    """Every committed status change is an edge of the state machine, and
    every row is born in a starting state."""
    changes = _status_changes(snap)
    if changes is None:
        return []
    out = []
    for a in changes:
        tbl = a["tbl"]
        if a["what"] == "insert":
            if a["new_status"] not in BORN.get(tbl, {a["new_status"]}):
                out.append(_v("no_backwards", a["row_id"], f"{tbl} row born {a['new_status']}"))
        elif (a["old_status"], a["new_status"]) not in ALLOWED.get(tbl, set()):
            out.append(_v("no_backwards", a["row_id"],
                          f"{tbl}: {a['old_status']} -> {a['new_status']} is not a forward transition"))
    return out


def _expected_events(snap: Snapshot) -> Counter:
    """``(payment_intent_id, type, object id, expired)`` each transition must
    have written once. From the audit when recorded, else from final states."""
    charges = {c["id"]: c for c in snap["charges"]}
    refunds = {r["id"]: r for r in snap.get("refunds", [])}
    expected: Counter = Counter()

    def charge_event(charge_id: str, type_: str, expired: bool | None = None):
        expected[(charges[charge_id]["payment_intent_id"], type_, charge_id, expired)] += 1

    def refund_event(refund_id: str, type_: str):
        charge = charges[refunds[refund_id]["charge_id"]]
        expected[(charge["payment_intent_id"], type_, refund_id, None)] += 1

    audit = snap.get("audit")
    if audit is not None:
        for a in audit:
            if a["tbl"] == "charges" and a["row_id"] in charges:
                if a["what"] == "insert":
                    charge_event(a["row_id"], "payment_intent.processing", False)
                elif a["what"] == "prompt_expired":
                    charge_event(a["row_id"], "payment_intent.processing", True)
                elif a["new_status"] == "succeeded":
                    charge_event(a["row_id"], "payment_intent.succeeded")
                elif a["new_status"] == "failed":
                    charge_event(a["row_id"], "payment_intent.payment_failed")
            elif a["tbl"] == "refunds" and a["row_id"] in refunds and a["what"] == "status":
                if a["new_status"] in TERMINAL:
                    refund_event(a["row_id"], f"refund.{a['new_status']}")
        return expected
    for c in charges.values():
        charge_event(c["id"], "payment_intent.processing", False)
        if c.get("prompt_expired"):
            charge_event(c["id"], "payment_intent.processing", True)
        if c["status"] == "succeeded":
            charge_event(c["id"], "payment_intent.succeeded")
        elif c["status"] == "failed":
            charge_event(c["id"], "payment_intent.payment_failed")
    for r in refunds.values():
        if r["status"] in TERMINAL:
            refund_event(r["id"], f"refund.{r['status']}")
    return expected


def _event_key(e: dict[str, Any]) -> tuple:
    if e["type"].startswith("refund."):
        return (e["payment_intent_id"], e["type"], e.get("refund_id"), None)
    expired = bool(e.get("expired")) if e["type"] == "payment_intent.processing" else None
    return (e["payment_intent_id"], e["type"], e.get("charge_id"), expired)


def check_events_match(snap: Snapshot) -> list[Violation]:
    """Events equal transitions exactly: one ``payment_intent.processing``
    per charge created, one (``expired: true``) per prompt expiry, one
    terminal event per terminal transition of the charge's own status, one
    ``refund.*`` per terminal refund transition; nothing else. The final
    state must agree too: a terminal charge has its one terminal event."""
    expected = _expected_events(snap)
    actual = Counter(_event_key(e) for e in snap["events"])
    out = []
    for key in sorted(set(expected) | set(actual), key=str):
        want, got = expected.get(key, 0), actual.get(key, 0)
        if want != got:
            intent, type_, obj, expired = key
            label = type_ + (" (expired)" if expired else "")
            out.append(_v("events_match", obj or intent,
                          f"{label}: {got} event(s) for {want} transition(s)", payment_intent=intent))
    by_charge = defaultdict(list)
    for e in snap["events"]:
        if e["type"] in ("payment_intent.succeeded", "payment_intent.payment_failed"):
            by_charge[e.get("charge_id")].append(e["type"])
    for c in snap["charges"]:
        want = {"succeeded": ["payment_intent.succeeded"],
                "failed": ["payment_intent.payment_failed"]}.get(c["status"], [])
        if sorted(by_charge.get(c["id"], [])) != want:
            out.append(_v("events_match", c["id"], f"charge is {c['status']} but its terminal events "
                                                   f"are {by_charge.get(c['id'], [])}"))
    return out


def check_intent_follows(snap: Snapshot) -> list[Violation]:
    """An intent's status follows its charge: succeeded ↔ succeeded,
    requires_payment_method ↔ failed, processing ↔ pending / unresolved."""
    follow = {"succeeded": {"succeeded"}, "failed": {"requires_payment_method"},
              "pending": {"processing"}, "unresolved": {"processing"}}
    intents = {i["id"]: i for i in snap["intents"]}
    out = []
    for c in snap["charges"]:
        intent = intents.get(c["payment_intent_id"])
        if intent is None:
            out.append(_v("intent_follows", c["id"], "charge without an intent"))
        elif intent["status"] not in follow[c["status"]]:
            out.append(_v("intent_follows", intent["id"],
                          f"intent {intent['status']} while its charge {c['id']} is {c['status']}"))
    return out


def check_live_work(snap: Snapshot) -> list[Violation]:
    """Every non-terminal charge has a poll job that is not dead-lettered;
    every non-terminal refund a refund_poll job (design page, "The job
    queue": the poll job is born with the charge)."""
    live_jobs = {j["dedupe_key"] for j in snap["jobs"] if not j["dead"]}
    out = []
    for c in snap["charges"]:
        if c["status"] in LIVE and f"poll:{c['id']}" not in live_jobs:
            out.append(_v("live_work", c["id"], f"charge {c['status']} without a live poll job"))
    for r in snap.get("refunds", []):
        if r["status"] in LIVE and f"refund_poll:{r['id']}" not in live_jobs:
            out.append(_v("live_work", r["id"], f"refund {r['status']} without a live refund_poll job"))
    return out


def check_dead_letters(snap: Snapshot) -> list[Violation]:
    """No job is dead-lettered: every fault of the run is transient, so a
    parked job is work vpay gave up on."""
    return [_v("dead_letter", j["dedupe_key"], f"{j['kind']} job dead-lettered: {j.get('last_error')}")
            for j in snap["jobs"] if j["dead"]]


def check_refunds_bounded(snap: Snapshot) -> list[Violation]:
    """Refunds never exceed the charge: the non-failed refunds of a charge
    add up to at most its amount, and only a succeeded charge is refunded."""
    charges = {c["id"]: c for c in snap["charges"]}
    total: Counter = Counter()
    out = []
    for r in snap.get("refunds", []):
        charge = charges.get(r["charge_id"])
        if charge is None or charge["status"] != "succeeded":
            out.append(_v("refunds_bounded", r["id"], f"refund of a charge that is not succeeded "
                                                      f"({charge and charge['status']})"))
        if r["status"] != "failed":
            total[r["charge_id"]] += r["amount"]
    for charge_id, amount in sorted(total.items()):
        if charge_id in charges and amount > charges[charge_id]["amount"]:
            out.append(_v("refunds_bounded", charge_id,
                          f"refunds add up to {amount} > charge amount {charges[charge_id]['amount']}"))
    return out


def _rail_failed(txn: dict[str, Any] | None) -> bool:
    return txn is not None and txn["status"] == "FAILED" and txn.get("reason") not in NOT_FINAL_REASONS


def check_ledger(snap: Snapshot) -> list[Violation]:
    """Our charges and refunds against the rail's ledger (the rail's truth):

    * no charge succeeded that the rail did not succeed (for its amount);
    * every rail success is ``succeeded``, or still ``pending`` /
      ``unresolved`` with an alert naming the charge;
    * no charge failed that the rail holds as anything but a final failure,
      and a failure carries the rail's reason; a reference the rail never
      recorded fails only as ``not_submitted`` (``unsubmitted_codes``);
    * a success records the rail's transaction id;
    * the same for refunds."""
    alerts = defaultdict(set)
    for a in snap.get("alerts", []):
        alerts[a.get("refund_id") or a.get("charge_id")].add(a["kind"])
    unsubmitted = set(snap.get("unsubmitted_codes", UNSUBMITTED_CODES))
    out = []
    for kind, rows, table in (("charge", snap["charges"], "transactions"),
                              ("refund", snap.get("refunds", []), "refunds")):
        ledger = snap["rail"].get(table, {})
        for row in rows:
            txn = ledger.get(row["rail_reference"])
            rail_status = txn["status"] if txn else None
            if row["status"] == "failed" and txn is None and row["failure_code"] not in unsubmitted:
                out.append(_v("ledger", row["id"], f"{kind} failed with {row['failure_code']}; the rail "
                                                   f"never recorded it (only {sorted(unsubmitted)} may say so)",
                              rail_reference=row["rail_reference"]))
            if row["status"] == "succeeded":
                if rail_status != "SUCCESSFUL":
                    out.append(_v("ledger", row["id"], f"{kind} succeeded; the rail says {rail_status} "
                                                       f"{(txn or {}).get('reason') or ''}".rstrip(),
                                  rail_reference=row["rail_reference"]))
                elif _minor(txn["amount"]) != row["amount"]:
                    out.append(_v("ledger", row["id"], f"{kind} succeeded for {row['amount']}; the rail "
                                                       f"collected {txn['amount']}"))
                elif txn.get("transaction_id") and row.get("rail_transaction_id") != txn["transaction_id"]:
                    out.append(_v("ledger", row["id"], f"{kind} records rail transaction "
                                                       f"{row.get('rail_transaction_id')}; the rail's is "
                                                       f"{txn['transaction_id']}"))
            elif rail_status == "SUCCESSFUL":
                if row["status"] == "failed" or not alerts.get(row["id"]):
                    out.append(_v("ledger", row["id"], f"the rail succeeded this {kind}; ours is "
                                                       f"{row['status']} without an alert",
                                  rail_reference=row["rail_reference"]))
            if row["status"] == "failed" and txn is not None:
                if not _rail_failed(txn):
                    out.append(_v("ledger", row["id"], f"{kind} failed ({row['failure_code']}); the rail "
                                                       f"holds it {rail_status} {txn.get('reason') or ''}"
                                  .rstrip(), rail_reference=row["rail_reference"]))
                elif txn.get("reason") and row["failure_code"] != txn["reason"]:
                    out.append(_v("ledger", row["id"], f"{kind} failed with {row['failure_code']}; the "
                                                       f"rail's reason is {txn['reason']}"))
    return out


def check_deliveries(snap: Snapshot) -> list[Violation]:
    """Every event reached every endpoint of its merchant at least once,
    signed: the receiver verified its Standard Webhooks signature; no
    receiver saw a bad signature or an event we have no record of."""
    merchant_of = {i["id"]: i["merchant_id"] for i in snap["intents"]}
    endpoints = defaultdict(list)
    for ep in snap["endpoints"]:
        endpoints[ep["merchant_id"]].append(ep["id"])
    delivered = {ep: set(ids) for ep, ids in snap["delivered"].items()}
    known = {e["id"] for e in snap["events"]}
    out = []
    for e in snap["events"]:
        for ep in endpoints.get(merchant_of.get(e["payment_intent_id"]), []):
            if e["id"] not in delivered.get(ep, set()):
                out.append(_v("delivered", e["id"], f"{e['type']} never delivered to {ep}",
                              endpoint=ep))
    for ep, ids in sorted(delivered.items()):
        for event_id in sorted(ids - known):
            out.append(_v("delivered", event_id, f"{ep} received an event we have no record of"))
    for bad in snap.get("bad_signatures", []):
        out.append(_v("signed", bad.get("endpoint_id"), f"signature did not verify: {bad.get('error')}"))
    return out


def check_quiescent(snap: Snapshot) -> list[Violation]:
    """The run went quiet before its deadline once the faults stopped."""
    if snap.get("quiescent", True):
        return []
    return [_v("quiescent", "run", f"still moving at the deadline: {snap.get('unquiet')}")]


CHECKS: tuple[Callable[[Snapshot], list[Violation]], ...] = (
    check_terminal_once, check_no_backwards, check_events_match, check_intent_follows,
    check_live_work, check_dead_letters, check_refunds_bounded, check_ledger, check_deliveries,
    check_quiescent,
)


def run_all(snap: Snapshot, checks: Iterable[Callable[[Snapshot], list[Violation]]] = CHECKS
            ) -> list[Violation]:
    """Every violation of every check, in check order."""
    out: list[Violation] = []
    for check in checks:
        out.extend(check(snap))
    return out
