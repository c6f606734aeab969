"""The chaos run's plan, drawn from one seed: what each payment is (merchant,
payer, amount, what the rail will decide, refunds to try) and the fault
schedule (what strikes when, for how long). Same seed, same arguments ⇒ the
same plan, byte for byte (``plan_digest``); nothing here looks at a clock.

Per-request rail and receiver faults are decided inside a fault *window* of
the schedule by ``roll(seed, window, key, n)``: a hash of the seed, the
window's index, the request's identity (method, path, reference) and how
many times that identity was seen before. So the decision for "the 2nd status
read of reference R inside window 7" is the same in every run with that seed,
however the processes interleave; which requests fall inside a window depends
on timing, which no seed can fix.

Times are seconds from the start of the payment phase. Amounts are minor
units (EUR cents). Standard library only: the checks and the rail process
import this without vpay.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

FAULT_KINDS = (
    "worker_kill",        # SIGKILL a worker; restarted after `restart_after` s
    "worker_stop",        # SIGSTOP a worker for `seconds`, then SIGCONT
    "pg_restart",         # pg_ctl restart (-m fast | immediate) of the embedded Postgres
    "pg_terminate",       # pg_terminate_backend on the vpay database's backends
    "rail_5xx",           # window: rail answers 5xx (before or after acting on the request)
    "rail_timeout",       # window: rail never answers (before or after acting)
    "rail_trickle",       # window: rail acts, then sends its answer a few bytes at a time
    "rail_429",           # window: rail answers 429 with Retry-After, acting on nothing
    "callback_duplicate", # the same callback POSTed several times for some charges
    "callback_late",      # callbacks for settled charges, with a body claiming the opposite
    "receiver_500",       # window: a webhook receiver answers 500
    "receiver_hang",      # window: a webhook receiver holds the request past the timeout
)
WEIGHTS = {
    "worker_kill": 12, "worker_stop": 10, "pg_restart": 5, "pg_terminate": 8,
    "rail_5xx": 12, "rail_timeout": 8, "rail_trickle": 6, "rail_429": 8,
    "callback_duplicate": 9, "callback_late": 8, "receiver_500": 7, "receiver_hang": 7,
}
RAIL_WINDOW_KINDS = ("rail_5xx", "rail_timeout", "rail_trickle", "rail_429")
RECEIVER_WINDOW_KINDS = ("receiver_500", "receiver_hang")

MERCHANTS = {"chaos-a": ("r0", "r1"), "chaos-b": ("r2",)}
"""Merchant id → the receivers (webhook endpoints) it registers."""
RECEIVERS = ("r0", "r1", "r2")
WORKERS = 2

FAIL_REASONS = ("APPROVAL_REJECTED", "EXPIRED", "NOT_ENOUGH_FUNDS", "PAYER_LIMIT_REACHED")


@dataclass(frozen=True)
class Payment:
    """One payment of the run. ``script`` is the sandbox rail's payer script
    (``vpay.sandbox.mtn``: ``pending_reads``, ``outcome``, ``reason``,
    ``callback``, refund options); ``{}`` = the rail's default (success on
    its timer). ``expect`` is what the rail will decide: ``SUCCESSFUL``,
    ``FAILED`` or ``PENDING`` (never terminal: vpay keeps polling).
    ``refunds``: minor-unit amounts to refund in order once the charge has
    succeeded (``None`` = all that is left); a refund that would exceed the
    charge must be refused."""

    index: int
    merchant: str
    payer: str
    amount: int
    script: dict[str, Any]
    expect: str
    refunds: tuple[int | None, ...] = ()
    rail: str = "mtn"


NEW_RAILS = ("mpesa", "pawapay")
"""Rails a mixed-rail plan may also use (issue 29): their payments are
scripted on the in-process sandboxes (``vpay.sandbox.mpesa``, ``pawapay``:
``outcome`` approve/decline/never, ``in_flight``), in KES and ZMW."""


def _on_rail(rng: random.Random, p: "Payment", rails: tuple[str, ...]) -> "Payment":
    """``p`` moved to a rail drawn from ``rails`` (``rng`` is the plan's
    second generator, so a MoMo-only plan is the plan it always was). A
    payment on a new rail keeps its index, merchant and expected outcome;
    its payer, currency-shaped amount and script are the rail's; it has no
    refunds (M-Pesa refuses them; pawaPay's are not exercised here)."""
    rail = rng.choice(rails)
    if rail == "mtn":
        return p
    outcome = {"SUCCESSFUL": "approve", "FAILED": "decline", "PENDING": "never"}[p.expect]
    in_flight = int(p.script.get("pending_reads", 0)) if outcome != "never" else 0
    if rail == "mpesa":
        payer, amount = f"2547{p.index:08d}", max(100, p.amount - p.amount % 100)
    else:
        payer, amount = f"2607{p.index:08d}", p.amount
    return Payment(index=p.index, merchant=p.merchant, payer=payer, amount=amount,
                   script={"outcome": outcome, "in_flight": in_flight}, expect=p.expect, rail=rail)


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``at`` seconds into the payment phase, ``kind``
    (``FAULT_KINDS``), ``target`` (worker index, receiver name, or ``rail``,
    ``postgres``, ``api``) and its parameters (``seconds`` for a window or a
    stop, ``p`` the share of requests hit inside a window, ...)."""

    at: float
    kind: str
    target: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        ps = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"t={self.at:7.2f}s {self.kind:<18} {self.target:<8} {ps}"


@dataclass(frozen=True)
class Plan:
    seed: int
    rate: float
    payments: tuple[Payment, ...]
    faults: tuple[Fault, ...]

    @property
    def duration(self) -> float:
        """Seconds of the payment phase (the last payment's due time)."""
        return len(self.payments) / self.rate

    def to_json(self) -> dict[str, Any]:
        def payment(p: Payment) -> dict[str, Any]:
            out = asdict(p)
            if out["rail"] == "mtn":  # a MoMo-only plan keeps the digest it always had
                del out["rail"]
            return out
        return {"seed": self.seed, "rate": self.rate,
                "payments": [payment(p) for p in self.payments],
                "faults": [asdict(f) for f in self.faults]}

    def digest(self) -> str:
        """SHA-256 of the plan's canonical JSON: equal digests, equal plans."""
        raw = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(raw).hexdigest()

    def fault_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            out[f.kind] = out.get(f.kind, 0) + 1
        return dict(sorted(out.items()))


def _payment(rng: random.Random, index: int) -> Payment:
    merchant = "chaos-a" if rng.random() < 0.7 else "chaos-b"
    payer = f"2567{index:08d}"
    amount = rng.randrange(100, 500_000)
    r = rng.random()
    refunds: tuple[int | None, ...] = ()
    if r < 0.55:
        script = {"pending_reads": rng.randrange(0, 5), "outcome": "SUCCESSFUL"}
        expect = "SUCCESSFUL"
    elif r < 0.70:
        script, expect = {}, "SUCCESSFUL"  # the rail's timer decides
    elif r < 0.85:
        script = {"pending_reads": rng.randrange(0, 4), "outcome": "FAILED",
                  "reason": rng.choice(FAIL_REASONS)}
        expect = "FAILED"
    elif r < 0.95:
        script = {"pending_reads": rng.randrange(4, 8), "outcome": "SUCCESSFUL"}
        expect = "SUCCESSFUL"
    elif r < 0.98:
        script, expect = {"outcome": "PENDING"}, "PENDING"
    else:
        # MoMo's not-final reason: FAILED on the wire, pending for vpay
        script, expect = {"outcome": "FAILED", "reason": "ONGOING"}, "PENDING"
    if script and rng.random() < 0.25:
        script["callback"] = False  # the ladder alone must find the answer
    if expect == "SUCCESSFUL" and rng.random() < 0.05:
        shape = rng.choice(("full", "halves", "over", "failing"))
        if shape == "full":
            refunds = (None,)
        elif shape == "halves":
            refunds = (amount // 2, amount - amount // 2)
        elif shape == "over":
            refunds = (amount * 6 // 10, amount * 6 // 10)  # the second must be refused
        else:
            refunds = (amount // 3,)
            script["refund_outcome"] = "FAILED"
            script["refund_reason"] = "INTERNAL_PROCESSING_ERROR"
    return Payment(index=index, merchant=merchant, payer=payer, amount=amount, script=script,
                   expect=expect, refunds=refunds)


def _fault(rng: random.Random, kind: str, at: float, rate: float, lease: float,
           rail_read_timeout: float, webhook_read_timeout: float) -> Fault:
    if kind == "worker_kill":
        return Fault(at, kind, f"w{rng.randrange(WORKERS)}",
                     {"restart_after": round(rng.uniform(0.2, 3.0), 2)})
    if kind == "worker_stop":
        # some stops outlast the lease: the job is reaped and re-run while the
        # stopped worker still holds its answer (it must be fenced off)
        return Fault(at, kind, f"w{rng.randrange(WORKERS)}",
                     {"seconds": round(rng.uniform(0.5, lease * 2.0), 2)})
    if kind == "pg_restart":
        return Fault(at, kind, "postgres", {"mode": rng.choice(("fast", "immediate"))})
    if kind == "pg_terminate":
        return Fault(at, kind, "postgres", {"share": round(rng.uniform(0.3, 1.0), 2)})
    if kind == "rail_5xx":
        return Fault(at, kind, "rail", {"seconds": round(rng.uniform(2, 8), 2),
                                        "p": round(rng.uniform(0.3, 0.9), 2),
                                        "code": rng.choice((500, 502, 503)),
                                        "after_p": round(rng.uniform(0.2, 0.8), 2)})
    if kind == "rail_timeout":
        return Fault(at, kind, "rail", {"seconds": round(rng.uniform(2, 6), 2),
                                        "p": round(rng.uniform(0.2, 0.6), 2),
                                        "hang": round(rail_read_timeout + rng.uniform(0.5, 2.0), 2),
                                        "after_p": round(rng.uniform(0.2, 0.8), 2)})
    if kind == "rail_trickle":
        return Fault(at, kind, "rail", {"seconds": round(rng.uniform(2, 6), 2),
                                        "p": round(rng.uniform(0.2, 0.6), 2),
                                        "trickle": round(rng.uniform(1.0, 3.0 * rail_read_timeout + 1.0), 2)})
    if kind == "rail_429":
        return Fault(at, kind, "rail", {"seconds": round(rng.uniform(2, 6), 2),
                                        "p": round(rng.uniform(0.3, 0.9), 2),
                                        "retry_after": rng.randrange(1, 4)})
    if kind in ("callback_duplicate", "callback_late"):
        created = max(1, int(at * rate))
        picks = sorted(rng.sample(range(created), min(created, rng.randrange(2, 8))))
        params: dict[str, Any] = {"payments": picks, "times": rng.randrange(2, 5),
                                  "unknown_refs": rng.randrange(0, 3)}
        return Fault(at, kind, "api", params)
    if kind == "receiver_500":
        return Fault(at, kind, rng.choice(RECEIVERS), {"seconds": round(rng.uniform(2, 10), 2),
                                                       "p": round(rng.uniform(0.5, 1.0), 2)})
    if kind == "receiver_hang":
        return Fault(at, kind, rng.choice(RECEIVERS), {
            "seconds": round(rng.uniform(2, 8), 2), "p": round(rng.uniform(0.3, 0.8), 2),
            "hang": round(webhook_read_timeout + rng.uniform(0.5, 2.0), 2)})
    raise ValueError(f"unknown fault kind {kind!r}")


def make_plan(seed: int, payments: int, faults: int, rate: float, *, lease: float = 8.0,
              rail_read_timeout: float = 2.0, webhook_read_timeout: float = 2.0,
              rails: tuple[str, ...] = ("mtn",)) -> Plan:
    """The whole run from ``seed``: ``payments`` payments due at ``rate`` per
    second, and ``faults`` faults at seeded times within the payment phase
    (never in its first 5 % nor after 95 %). The first ``len(FAULT_KINDS)``
    faults take each kind once (in a seeded order), so a small run still
    sees every kind it has room for; the rest are drawn by ``WEIGHTS``.
    ``rails``: the rails payments are spread over (``mtn`` and
    ``NEW_RAILS``), drawn from a second generator of the seed.
    Raises ``ValueError`` for non-positive sizes or rate, or an unknown rail."""
    if payments < 1 or faults < 0 or rate <= 0:
        raise ValueError("payments must be >= 1, faults >= 0, rate > 0")
    if not rails or any(r not in ("mtn", *NEW_RAILS) for r in rails):
        raise ValueError(f"rails must be among mtn, {', '.join(NEW_RAILS)}")
    rng = random.Random(seed)
    plan_payments = tuple(_payment(rng, i) for i in range(payments))
    if rails != ("mtn",):
        rail_rng = random.Random(f"{seed}:rails")
        plan_payments = tuple(_on_rail(rail_rng, p, rails) for p in plan_payments)
    duration = payments / rate
    order = list(FAULT_KINDS)
    rng.shuffle(order)
    kinds = order[:faults] + rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()),
                                         k=max(0, faults - len(order)))
    times = sorted(round(rng.uniform(0.05 * duration, 0.95 * duration), 2) for _ in kinds)
    rng.shuffle(kinds)
    plan_faults = tuple(_fault(rng, k, t, rate, lease, rail_read_timeout, webhook_read_timeout)
                        for k, t in zip(kinds, times))
    return Plan(seed=seed, rate=rate, payments=plan_payments, faults=plan_faults)


def roll(seed: int, window: int, key: str, n: int, salt: str = "") -> float:
    """A number in [0, 1) fixed by the seed, the window's index, the
    request's identity ``key`` and ``n`` (how many times ``key`` was seen in
    this window before): the per-request fault decision."""
    raw = f"{seed}|{window}|{key}|{n}|{salt}".encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big") / 2**64


class WindowDecider:
    """Decides, per request, which fault window (if any) strikes it.
    ``windows``: ``[(index, start, end, kind, params)]`` in seconds since
    ``t0`` (the caller's clock). ``decide(now, key)`` answers ``(kind,
    params, index, roll)`` or ``None``. Thread-safe."""

    def __init__(self, seed: int, windows: list[tuple[int, float, float, str, dict[str, Any]]]):
        import threading
        self.seed = seed
        self.windows = windows
        self.enabled = True
        self._seen: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()

    def decide(self, elapsed: float, key: str):
        if not self.enabled:
            return None
        for index, start, end, kind, params in self.windows:
            if start <= elapsed < end:
                with self._lock:
                    n = self._seen.get((index, key), 0)
                    self._seen[(index, key)] = n + 1
                r = roll(self.seed, index, key, n)
                if r < params.get("p", 1.0):
                    return kind, params, index, roll(self.seed, index, key, n, "after")
        return None


def windows_of(plan: Plan, kinds: tuple[str, ...], target: str | None = None):
    """The fault windows of ``kinds`` (optionally for one ``target``) as
    ``WindowDecider`` wants them."""
    return [(i, f.at, f.at + f.params["seconds"], f.kind, f.params)
            for i, f in enumerate(plan.faults)
            if f.kind in kinds and (target is None or f.target == target)]
