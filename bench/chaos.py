"""The chaos run (issue 12): real vpay processes under seeded faults, then
the money invariants checked against the rail's own ledger.

    python bench/chaos.py --seed 7 --payments 30 --faults 8 [--rate 3] [--report out.json]

What runs, all on 127.0.0.1, all real processes or real HTTP servers:

* its own embedded Postgres (pgserver) under a temporary folder, so that it
  can restart it and terminate its backends;
* two ``vpay-worker`` processes (the installed console script) and
  ``vpay-server api`` (gunicorn); merchants and webhook endpoints are made
  with ``vpay-server merchants create`` / ``webhooks add``; refunds with
  ``vpay-server refunds create``;
* the rail: ``bench/chaos_rail.py`` in its own process, vpay's MoMo sandbox
  behind a fault layer, whose ledger is the rail's truth;
* three webhook receivers (threads of this process) that verify every
  delivery with the ``standardwebhooks`` library and record the event ids.

The plan (``chaos_schedule.make_plan``) is drawn from the seed: every
payment's merchant, payer, amount and rail outcome, the refunds to try, and
the fault schedule, printed at the start with its digest (same seed and
sizes ⇒ same digest). Payments are created through ``POST
/v1/payment_intents`` at ``--rate`` per second while the faults strike.
Then the faults stop (stopped workers continued, killed ones restarted),
parked jobs are made due (the tests' time machine: ``run_at = now()``, so
the ladder's minutes pass in seconds), Daraja's STK callbacks are posted
in a mixed-rail run (``daraja_callbacks``), and the run waits, up to
``--deadline`` seconds, for quiescence. The snapshot is checked by
``chaos_checks.run_all``; the report (counts, faults by type, violations
with ids) is printed and written to ``--report``. Exit 0: no violation;
1: violations; 2: usage; 3: the harness itself could not run.

Instrumentation: after migrating, the harness adds to its own database a
``chaos_audit`` table and AFTER triggers on ``charges``, ``payment_intents``
and ``refunds`` recording every committed status change (and prompt
expiry), so that "no status moved backwards" and "events equal
transitions" are checked on the history, not just the final state. vpay
never reads that table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos_checks  # noqa: E402
from chaos_procs import Db, Postgres, Proc, free_port, log, run_cli, script_path  # noqa: E402
from chaos_receivers import Receiver  # noqa: E402
from chaos_schedule import MERCHANTS, RAIL_WINDOW_KINDS, WORKERS, Plan, make_plan, windows_of  # noqa: E402

HERE = Path(__file__).resolve().parent
HARNESS_APP = "chaos-harness"  # application_name of our own connections: never terminated

AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS chaos_audit (
    id bigserial PRIMARY KEY, tbl text NOT NULL, row_id text NOT NULL,
    old_status text, new_status text, what text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION chaos_audit_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO chaos_audit (tbl, row_id, new_status, what) VALUES (TG_TABLE_NAME, NEW.id, NEW.status, 'insert');
  ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
    INSERT INTO chaos_audit (tbl, row_id, old_status, new_status, what)
    VALUES (TG_TABLE_NAME, NEW.id, OLD.status, NEW.status, 'status');
  END IF;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION chaos_audit_prompt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.prompt_expired_at IS NULL AND NEW.prompt_expired_at IS NOT NULL THEN
    INSERT INTO chaos_audit (tbl, row_id, old_status, new_status, what)
    VALUES ('charges', NEW.id, OLD.status, NEW.status, 'prompt_expired');
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit_charges AFTER INSERT OR UPDATE ON charges
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_status();
CREATE TRIGGER chaos_audit_charges_prompt AFTER UPDATE ON charges
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_prompt();
CREATE TRIGGER chaos_audit_intents AFTER INSERT OR UPDATE ON payment_intents
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_status();
CREATE TRIGGER chaos_audit_refunds AFTER INSERT OR UPDATE ON refunds
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_status();
"""


# --------------------------------------------------------------------------- the run


class Chaos:
    def __init__(self, args: argparse.Namespace, plan: Plan):
        self.args = args
        self.plan = plan
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"vpay-chaos-{args.seed}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.t0_ref = [float("inf")]
        self.violations: list[dict] = []
        self.applied: Counter = Counter()
        self.skipped: Counter = Counter()
        self.fault_log: list[str] = []
        self.created: dict[int, dict] = {}
        self.create_failures: dict[int, str] = {}
        self.held_keys: list[dict] = []
        self.not_created_held: set[int] = set()
        self.api_answers: Counter = Counter()
        self.refund_results: Counter = Counter()
        self.refund_done: set[int] = set()
        self.refund_unexpected: list[dict] = []
        self.callback_answers: Counter = Counter()
        self.loads: list[float] = []
        self.workers: list[Proc | None] = [None] * WORKERS
        self.worker_gen = [0] * WORKERS
        self.worker_lock = threading.Lock()
        self.restarts: Counter = Counter()
        self.stop_event = threading.Event()
        self.timers: list[threading.Timer] = []
        self.procs: list[Proc] = []
        self.rail_proc: subprocess.Popen | None = None
        self.receivers: dict[str, Receiver] = {}
        self.pg: Postgres | None = None
        self.times: dict[str, float] = {}
        self.forever_payers = [p.payer for p in plan.payments if p.expect == "PENDING"]
        self.doubles: dict = {}   # mpesa / pawapay sandboxes, in this process (mixed-rail runs)
        # Webhook secrets are sealed under VPAY_SECRET_KEYS (docs/security.md): the
        # caller's key when it has one, else one made for this run.
        from vpay.base.secretbox import new_key
        self.secret_keys = os.environ.get("VPAY_SECRET_KEYS", "").strip() or new_key()
        self.new_rail_violations: list[dict] = []
        self.called_back: set[str] = set()   # Daraja pushes whose STK callback was posted

    # ------------------------------------------------------------ setup

    def env(self, **extra: str) -> dict[str, str]:
        from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY
        env = {k: v for k, v in os.environ.items() if not k.startswith("VPAY_") and k != "NOTIFY_SOCKET"}
        env.update({
            "PYTHONUNBUFFERED": "1",
            "VPAY_DATABASE_URL": self.db_url,
            "VPAY_MTN_BASE_URL": self.rail_url,
            "VPAY_MTN_SUBSCRIPTION_KEY": DEFAULT_SUBSCRIPTION_KEY,
            "VPAY_MTN_API_USER": DEFAULT_API_USER,
            "VPAY_MTN_API_KEY": DEFAULT_API_KEY,
            "VPAY_MTN_CALLBACK_URL": f"{self.api_url}/provider/mtn/callback",
            "VPAY_MTN_CONNECT_TIMEOUT_SECONDS": "1",
            "VPAY_MTN_READ_TIMEOUT_SECONDS": str(self.args.rail_read_timeout),
            # one rail call's whole time (the isolation issue's total deadline): a
            # trickling answer longer than this is cut
            "VPAY_MTN_TOTAL_TIMEOUT_SECONDS": str(self.args.rail_total_timeout),
            "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1",
            "VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS": "1",
            "VPAY_WEBHOOK_READ_TIMEOUT_SECONDS": str(self.args.webhook_read_timeout),
            "VPAY_PROMPT_TTL_SECONDS": str(self.args.prompt_ttl),
            "VPAY_DATABASE_OPEN_TIMEOUT_SECONDS": "30",
            "VPAY_LOG_LEVEL": self.args.log_level,
            "VPAY_SECRET_KEYS": self.secret_keys,
        })
        if "mpesa" in self.doubles:
            env.update(self.doubles["mpesa"].env(f"{self.api_url}/provider/mpesa/callback"))
        if "pawapay" in self.doubles:
            env.update(self.doubles["pawapay"].env())
        env.update(extra)
        return env

    def setup(self) -> None:
        import psycopg
        t = time.monotonic()
        # A folder (and so a socket path) of this run's own: processes left
        # over from a killed run in the same workdir cannot reach this database.
        self.pg = Postgres(self.workdir / f"pg-{uuid.uuid4().hex[:8]}")
        with psycopg.connect(self.pg.url("postgres"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE chaos")
        self.db_url = self.pg.url("chaos")
        self.db = Db(self.pg.url("chaos", HARNESS_APP))
        self.admin = Db(self.pg.url("postgres", HARNESS_APP))
        self.api_port = free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        # the rail, in its own process
        config = {"seed": self.plan.seed, "windows": windows_of(self.plan, RAIL_WINDOW_KINDS),
                  "scripts": {p.payer: p.script for p in self.plan.payments if p.script and p.rail == "mtn"},
                  "success_after_seconds": self.args.success_after}
        (self.workdir / "rail.json").write_text(json.dumps(config))
        self.rail_log = open(self.workdir / "rail.log", "ab")
        self.rail_proc = subprocess.Popen([sys.executable, str(HERE / "chaos_rail.py"), "--config",
                                           str(self.workdir / "rail.json")],
                                          stdout=subprocess.PIPE, stderr=self.rail_log,
                                          stdin=subprocess.DEVNULL, text=True)
        line = self.rail_proc.stdout.readline()
        if not line:
            raise RuntimeError("the rail process did not start (see rail.log)")
        self.rail_url = json.loads(line)["url"]
        self.start_new_rails()
        env = self.env()
        out = run_cli(env, "migrate")
        if out.returncode != 0:
            raise RuntimeError(f"migrate failed: {out.stderr[-2000:]}")
        self.db.run(lambda conn: conn.execute(AUDIT_SQL))
        self.endpoint_backoff = bool(self.db.all(
            "SELECT 1 FROM information_schema.columns WHERE table_name = 'webhook_endpoints' "
            "AND column_name = 'backoff_until'"))
        self.keys: dict[str, str] = {}
        for receiver_name in sorted({r for rs in MERCHANTS.values() for r in rs}):
            self.receivers[receiver_name] = Receiver(receiver_name, self.plan.seed, self.plan, self.t0_ref)
        for merchant, receivers in MERCHANTS.items():
            out = run_cli(env, "merchants", "create", "--id", merchant, "--name", merchant, "--json")
            if out.returncode != 0:
                raise RuntimeError(f"merchants create failed: {out.stderr[-2000:]}")
            self.keys[merchant] = json.loads(out.stdout)["api_key"]
            for name in receivers:
                out = run_cli(env, "webhooks", "add", "--merchant", merchant, "--url", self.receivers[name].url, "--json")
                if out.returncode != 0:
                    raise RuntimeError(f"webhooks add failed: {out.stderr[-2000:]}")
                endpoint = json.loads(out.stdout)
                self.receivers[name].secret = endpoint["secret"]
                self.receivers[name].endpoint_id = endpoint["id"]
        api = Proc("api", [script_path("vpay-server"), "api", "--bind", f"127.0.0.1:{self.api_port}",
                           "--workers", "2", "--threads", "4"], env, self.workdir / "api.log")
        self.procs.append(api)
        self.api = api
        self._wait_http(f"{self.api_url}/healthz", api, 60)
        for i in range(WORKERS):
            self.start_worker(i)
        self.times["setup_seconds"] = round(time.monotonic() - t, 1)
        log(f"ready in {self.times['setup_seconds']} s: workdir {self.workdir}, rail {self.rail_url}, "
            f"api {self.api_url}")

    def start_new_rails(self) -> None:
        """The M-Pesa and pawaPay sandboxes of a mixed-rail plan, in this
        process (they outlive every fault: only MoMo's rail is faulted), each
        payer scripted as the plan says."""
        import logging
        from vpay.sandbox.mpesa import MpesaSandbox
        from vpay.sandbox.pawapay import PawaPaySandbox
        for code, make in (("mpesa", MpesaSandbox), ("pawapay", PawaPaySandbox)):
            mine = [p for p in self.plan.payments if p.rail == code]
            if not mine:
                continue
            logging.getLogger(f"vpay.sandbox.{code}").setLevel(logging.WARNING)
            double = self.doubles[code] = make().start()
            for p in mine:
                double.script_payer(p.payer, **p.script)

    def new_rail_ledger(self) -> tuple[dict, list[dict]]:
        """The new rails' truth as ``chaos_checks`` reads a ledger, by our
        reference: a payer's scripted decision (``never``: PENDING), the
        amount in major units, the provider's transaction id (pawaPay).
        Also the violations no ledger check can see: an M-Pesa reference
        pushed more than once to a payer who approves (a lost STK answer
        re-sent: the payer could pay twice; docs/flows/mpesa.md)."""
        ledger, extra = {}, []
        reasons = {"mpesa": {"approve": (None, "SUCCESSFUL"), "decline": ("MPESA_1032", "FAILED"),
                             "never": (None, "PENDING")},
                   "pawapay": {"approve": (None, "SUCCESSFUL"), "decline": ("INSUFFICIENT_BALANCE", "FAILED"),
                               "never": (None, "PENDING")}}
        if "mpesa" in self.doubles:
            pushes: dict[str, list[dict]] = {}
            for push in self.doubles["mpesa"].pushes():
                pushes.setdefault(push["reference"], []).append(push)
            for ref, mine in pushes.items():
                reason, status = reasons["mpesa"][mine[-1]["outcome"]]
                ledger[ref] = {"status": status, "reason": reason, "amount": f"{mine[-1]['amount']}.00",
                               "transaction_id": None}
                if len(mine) > 1 and mine[-1]["outcome"] == "approve":
                    extra.append({"check": "mpesa_double_prompt", "id": ref,
                                  "detail": f"{len(mine)} STK pushes for one charge to a payer who approves"})
        if "pawapay" in self.doubles:
            for p in self.plan.payments:
                if p.rail != "pawapay" or p.index not in self.created:
                    continue
                charge = self.charge_of(p.index)
                deposit = self.doubles["pawapay"].deposit(charge["rail_reference"]) if charge else None
                if deposit is None:
                    continue
                reason, status = reasons["pawapay"][deposit["outcome"]]
                ledger[deposit["id"]] = {"status": status, "reason": reason, "amount": deposit["body"]["amount"],
                                         "transaction_id": deposit["provider_transaction_id"]
                                         if status == "SUCCESSFUL" else None}
        return ledger, extra

    def _wait_http(self, url: str, proc: Proc, timeout: float) -> None:
        import requests
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited {proc.popen.returncode}; see {proc.log_path}")
            try:
                if requests.get(url, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{url} did not answer within {timeout} s")

    def start_worker(self, i: int) -> Proc:
        with self.worker_lock:
            self.worker_gen[i] += 1
            args = [script_path("vpay-worker"), "--worker-concurrency", str(self.args.worker_concurrency),
                    "--lease-seconds", str(self.args.lease), "--idle-sleep", "0.5",
                    "--shutdown-grace-seconds", "5", "--worker-id", f"w{i}.{self.worker_gen[i]}"]
            proc = Proc(f"w{i}", args, self.env(), self.workdir / f"worker-w{i}.{self.worker_gen[i]}.log")
            self.workers[i] = proc
            self.procs.append(proc)
            return proc

    # ------------------------------------------------------------ payments

    def create_payment(self, p) -> None:
        import requests
        headers = {"Authorization": f"Bearer {self.keys[p.merchant]}",
                   "Idempotency-Key": f"chaos-{self.plan.seed}-{p.index}"}
        currency, method = {"mtn": ("EUR", "mtn_momo"), "mpesa": ("KES", "mpesa"),
                            "pawapay": ("ZMW", "pawapay")}[p.rail]
        body = {"amount": p.amount, "currency": currency, "description": f"chaos payment {p.index}",
                "payment_method": {"type": method, "msisdn": p.payer}}
        deadline = time.monotonic() + self.args.create_deadline
        last = ""
        in_use_since: float | None = None
        while time.monotonic() < deadline:
            try:
                r = requests.post(f"{self.api_url}/v1/payment_intents", json=body, headers=headers, timeout=60)
            except requests.RequestException as exc:
                self.api_answers["error"] += 1
                last = f"{type(exc).__name__}"
                time.sleep(0.5)
                continue
            self.api_answers[r.status_code] += 1
            if r.status_code == 201 or r.status_code == 200:
                data = r.json()
                self.created[p.index] = {"intent": data["id"], "charge": data.get("latest_charge")}
                return
            last = f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code == 409 and "idempotency_key_in_use" in r.text:
                in_use_since = in_use_since or time.monotonic()
                if time.monotonic() - in_use_since > self.args.in_use_patience and self.resolve_held_key(p):
                    return
            if r.status_code in (409, 429, 500, 502, 503, 504):
                time.sleep(float(r.headers.get("Retry-After", "0.5") or 0.5))
                continue
            break  # 4xx other than those: the harness asked wrongly
        self.create_failures[p.index] = last

    def resolve_held_key(self, p) -> bool:
        """The API answers ``idempotency_key_in_use`` for a key whose request
        died with the database mid-way ("outcome unknown; the key stays in
        progress") until its 300 s stale limit passes. Rather than wait that
        long, look at what the key names: an intent committed under it is the
        payment (the API would answer it after the takeover); none means the
        API holds the key with nothing created: reported as ``held_keys``, not
        retried under another key (that could pay twice)."""
        rows = self.db.all("SELECT k.payment_intent_id, i.id IS NOT NULL AS committed, "
                           "(SELECT id FROM charges WHERE payment_intent_id = k.payment_intent_id LIMIT 1) "
                           "AS charge FROM idempotency_keys k LEFT JOIN payment_intents i "
                           "ON i.id = k.payment_intent_id WHERE k.merchant_id = %s AND k.key = %s",
                           (p.merchant, f"chaos-{self.plan.seed}-{p.index}"))
        if rows and rows[0]["committed"]:
            self.created[p.index] = {"intent": rows[0]["payment_intent_id"], "charge": rows[0]["charge"]}
            self.held_keys.append({"payment": p.index, "intent": rows[0]["payment_intent_id"],
                                   "committed": True})
            return True
        if rows:
            self.held_keys.append({"payment": p.index, "intent": rows[0]["payment_intent_id"],
                                   "committed": False})
            self.not_created_held.add(p.index)
            return True
        return False

    def run_payments(self) -> None:
        pool = ThreadPoolExecutor(max_workers=self.args.clients, thread_name_prefix="client")
        t0 = self.t0_ref[0]
        for p in self.plan.payments:
            due = t0 + p.index / self.plan.rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            pool.submit(self._guard, self.create_payment, p)
        pool.shutdown(wait=True)

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a harness bug must show, not hang the run
            self.violations.append({"check": "harness", "id": fn.__name__, "detail": traceback.format_exc()})

    def charge_of(self, index: int) -> dict | None:
        made = self.created.get(index)
        if not made:
            return None
        rows = self.db.all("SELECT id, status, rail_reference, amount FROM charges WHERE payment_intent_id = %s",
                           (made["intent"],))
        return rows[0] if rows else None

    # ------------------------------------------------------------ refunds

    def refunder(self) -> None:
        todo = {p.index: p for p in self.plan.payments if p.refunds}
        env = self.env()
        while todo and not self.stop_event.is_set():
            for i in [i for i in todo if i in self.create_failures or i in self.not_created_held]:
                todo.pop(i)  # never created: nothing to refund
            indexes = [i for i in todo if i in self.created]
            if not indexes:
                time.sleep(1)
                continue
            rows = {r["payment_intent_id"]: r for r in self.db.all(
                "SELECT id, payment_intent_id, status FROM charges WHERE payment_intent_id = ANY(%s)",
                ([self.created[i]["intent"] for i in indexes],))}
            progressed = False
            for i in indexes:
                charge = rows.get(self.created[i]["intent"])
                if charge is None or charge["status"] in ("pending", "unresolved"):
                    continue
                p = todo.pop(i)
                progressed = True
                if charge["status"] != "succeeded":
                    self.refund_results["charge_not_succeeded"] += 1
                    continue
                for n, amount in enumerate(p.refunds):
                    args = ["refunds", "create", "--charge", charge["id"]]
                    if amount is not None:
                        args += ["--amount", str(amount)]
                    for _ in range(30):
                        out = run_cli(env, *args)
                        if out.returncode != 69:  # database unreachable at start: nothing written
                            break
                        time.sleep(1)
                    self.refund_results[f"exit_{out.returncode}"] += 1
                    must_refuse = n == 1 and p.refunds[0] is not None and amount is not None \
                        and p.refunds[0] + amount > p.amount
                    # over the refundable amount is refused by the data: exit 1 (issue 28)
                    if must_refuse != (out.returncode == 1) or out.returncode not in (0, 1):
                        self.refund_unexpected.append({"payment": i, "charge": charge["id"], "amount": amount,
                                                       "exit": out.returncode,
                                                       "stderr": out.stderr.strip()[-300:]})
                self.refund_done.add(i)
            if not progressed:
                time.sleep(1)
        self.refund_idle.set()

    # ------------------------------------------------------------ faults

    def later(self, seconds: float, fn, *args) -> None:
        timer = threading.Timer(seconds, self._guard, (fn, *args))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def restart_worker(self, i: int, gen: int) -> None:
        if self.worker_gen[i] == gen and not self.workers[i].alive():
            self.start_worker(i)
            self.restarts[f"w{i}"] += 1

    def cont_worker(self, proc: Proc) -> None:
        if proc.stopped:
            proc.send(signal.SIGCONT)
            proc.stopped = False

    def apply(self, n: int, fault) -> None:
        kind, target, params = fault.kind, fault.target, fault.params
        note = ""
        if kind == "worker_kill":
            i = int(target[1:])
            proc = self.workers[i]
            with self.worker_lock:
                proc.expected_exit = True
                killed = proc.send(signal.SIGKILL)
                gen = self.worker_gen[i]
            if killed:
                proc.popen.wait(10)
                proc.stopped = False
                self.later(params["restart_after"], self.restart_worker, i, gen)
                note = f"pid {proc.pid}"
            else:
                self.skipped[kind] += 1
                note = "not running"
        elif kind == "worker_stop":
            proc = self.workers[int(target[1:])]
            if not proc.stopped and proc.send(signal.SIGSTOP):
                proc.stopped = True
                self.later(params["seconds"], self.cont_worker, proc)
                note = f"pid {proc.pid}"
            else:
                self.skipped[kind] += 1
                note = "already stopped or not running"
        elif kind == "pg_restart":
            t = time.monotonic()
            self.pg.restart(params["mode"])
            note = f"restarted in {time.monotonic() - t:.1f} s"
        elif kind == "pg_terminate":
            rows = self.admin.all("SELECT pid FROM pg_stat_activity WHERE datname = 'chaos' "
                                  "AND application_name <> %s AND pid <> pg_backend_pid() ORDER BY pid",
                                  (HARNESS_APP,))
            pids = [r["pid"] for r in rows]
            rng = random.Random(f"{self.plan.seed}:{n}")
            chosen = rng.sample(pids, max(1, round(len(pids) * params["share"]))) if pids else []
            for pid in chosen:
                self.admin.all("SELECT pg_terminate_backend(%s)", (pid,))
            note = f"{len(chosen)} of {len(pids)} backends"
        elif kind in ("callback_duplicate", "callback_late"):
            note = self.callbacks(n, kind, params)
        else:
            note = "window (rail / receiver decide per request)"
        self.applied[kind] += 1
        self.fault_log.append(f"{fault.describe()}  -> {note}")

    def callbacks(self, n: int, kind: str, params: dict) -> str:
        import requests
        rng = random.Random(f"{self.plan.seed}:cb:{n}")
        refs: list[tuple[str, dict]] = []
        for index in params["payments"]:
            charge = self.charge_of(index)
            if charge is None:
                self.skipped[f"{kind}_not_created"] += 1
                continue
            p = self.plan.payments[index]
            if kind == "callback_late":
                # a body claiming the opposite of what the rail will decide: a hint, never a fact
                status = "FAILED" if p.expect == "SUCCESSFUL" else "SUCCESSFUL"
                times = 1
            else:
                status = {"SUCCESSFUL": "SUCCESSFUL", "FAILED": "FAILED"}.get(p.expect, "PENDING")
                times = params["times"]
            body = {"amount": str(charge["amount"] / 100), "currency": "EUR", "status": status,
                    "financialTransactionId": str(rng.randrange(10**9, 10**10)),
                    "payer": {"partyIdType": "MSISDN", "partyId": p.payer}}
            refs.extend([(charge["rail_reference"], body)] * times)
        for _ in range(params["unknown_refs"]):
            refs.append((str(uuid.UUID(int=rng.getrandbits(128), version=4)), {"status": "SUCCESSFUL"}))
        for ref, body in refs:
            try:
                r = requests.post(f"{self.api_url}/provider/mtn/callback", params={"ref": ref}, json=body,
                                  timeout=10)
                self.callback_answers[r.status_code] += 1
            except requests.RequestException as exc:
                self.callback_answers[type(exc).__name__] += 1
        return f"{len(refs)} callbacks"

    def run_faults(self) -> None:
        t0 = self.t0_ref[0]
        for n, fault in enumerate(self.plan.faults):
            delay = t0 + fault.at - time.time()
            if delay > 0 and self.stop_event.wait(delay):
                return
            self._guard(self.apply, n, fault)

    def monitor(self) -> None:
        """Workers that exit on their own: 69 (database unreachable at boot:
        Postgres was restarting) is restarted as systemd would; anything else
        is a violation, and restarted too."""
        while not self.stop_event.wait(0.5):
            self.loads.append(os.getloadavg()[0])
            for i in range(WORKERS):
                with self.worker_lock:
                    proc = self.workers[i]
                    if proc is None or proc.alive() or proc.expected_exit:
                        continue
                    code = proc.popen.returncode
                    proc.expected_exit = True
                if code != 69:
                    self.violations.append({"check": "process", "id": proc.name,
                                            "detail": f"worker exited {code} on its own; log {proc.log_path}"})
                self.restarts[f"w{i}_exit_{code}"] += 1
                self.start_worker(i)
            if not self.api.alive():
                self.violations.append({"check": "process", "id": "api",
                                        "detail": f"vpay-server api exited {self.api.popen.returncode}"})
                return

    # ------------------------------------------------------------ recovery and quiescence

    def recover(self) -> None:
        self.rail_control("POST", "/_chaos/faults/off")
        for r in self.receivers.values():
            r.decider.enabled = False
        for t in self.timers:
            t.cancel()
        for i, proc in enumerate(self.workers):
            if proc.stopped:
                self.cont_worker(proc)
            if not proc.alive():
                with self.worker_lock:
                    proc.expected_exit = True
                self.start_worker(i)
                self.restarts[f"w{i}_recovery"] += 1

    def rail_control(self, method: str, path: str, body: dict | None = None) -> dict:
        import requests
        r = requests.request(method, f"{self.rail_url}{path}", json=body, timeout=120)
        r.raise_for_status()
        return r.json()

    def time_machine(self) -> int:
        if self.endpoint_backoff:
            # the isolation issue's endpoint back-off is a clock too: let it pass
            self.db.exec("UPDATE webhook_endpoints SET backoff_until = now() WHERE backoff_until > now()")
        return self.db.exec(
            "UPDATE jobs SET run_at = now() WHERE locked_at IS NULL AND run_at > now() "
            "AND run_at <> 'infinity' AND (kind IN ('deliver', 'resubmit', 'refund_poll', 'fanout') "
            "OR (kind = 'poll' AND payload->>'charge_id' IN (SELECT id FROM charges WHERE "
            "status IN ('pending', 'unresolved') AND payer <> ALL(%s))))", (self.forever_payers,))

    def unquiet(self) -> dict[str, int]:
        row = self.db.all(
            "SELECT (SELECT count(*) FROM charges WHERE status IN ('pending', 'unresolved') "
            "        AND payer <> ALL(%(forever)s) "
            # A push whose answer was lost on a rail that is not resend-safe
            # (M-Pesa: docs/flows/mpesa.md, "A lost answer") waits for the
            # callback's identifier, which daraja_callbacks posts as Daraja
            # does, so it must settle. Only a marked send that never reached
            # Daraja (its process died between the mark and the call) waits,
            # by design, for the 24 h horizon: nothing can call back about it.
            "        AND NOT (rail_data ? 'request_sent_at' AND NOT rail_data ? 'checkout_request_id' "
            "                 AND rail_reference <> ALL(%(pushed)s))) "
            "    AS live_charges, "
            " (SELECT count(*) FROM refunds WHERE status IN ('pending', 'unresolved')) AS live_refunds, "
            " (SELECT count(*) FROM jobs WHERE run_at <> 'infinity' AND (kind IN "
            "        ('fanout', 'deliver', 'resubmit', 'refund_poll') OR (kind = 'poll' AND "
            "        payload->>'charge_id' IN (SELECT id FROM charges WHERE status IN ('succeeded', 'failed')))))"
            "    AS live_jobs", {"forever": self.forever_payers, "pushed": self.daraja_references()})[0]
        out = {k: v for k, v in row.items() if v}
        missing = self.undelivered()
        if missing:
            out["undelivered"] = missing
        if not self.refund_idle.is_set():
            out["refunds_to_make"] = 1
        settled = len(self.created) + len(self.create_failures) + len(self.not_created_held)
        if settled < len(self.plan.payments):
            out["payments_to_create"] = len(self.plan.payments) - settled
        return out

    def daraja_references(self) -> list[str]:
        """Our references of every STK push the Daraja double received."""
        if "mpesa" not in self.doubles:
            return []
        return [p["reference"] for p in self.doubles["mpesa"].pushes() if p["reference"]]

    def daraja_callbacks(self) -> None:
        """Daraja's STK callback, once, for every push whose payer decided
        (approved or declined; a payer who never answers gets none), as
        Daraja posts it to the push's CallBackURL: a hint that gives vpay the
        ``CheckoutRequestID`` of a push whose answer it lost (docs/flows/mpesa.md,
        "A lost answer"). Posted after the faults (here, while waiting for
        quiescence), so none is lost to a fault: a callback lost in a real
        outage leaves the charge to the 24-hour horizon and the statement,
        which a run does not reach. The double's ``notify`` answers the HTTP
        status (``None``: not sent); a push is called back again next time
        only when the API did not take it (not 2xx)."""
        if "mpesa" not in self.doubles:
            return
        double = self.doubles["mpesa"]
        for push in double.pushes():
            if push["outcome"] == "never" or push["checkout"] in self.called_back:
                continue
            status = double.notify(push["checkout"])
            self.callback_answers[f"mpesa_{status}"] += 1
            if status is not None and 200 <= status < 300:
                self.called_back.add(push["checkout"])

    def undelivered(self) -> int:
        events = self.db.all("SELECT e.id, i.merchant_id FROM events e "
                             "JOIN payment_intents i ON i.id = e.payment_intent_id")
        missing = 0
        for e in events:
            for name in MERCHANTS[e["merchant_id"]]:
                if e["id"] not in self.receivers[name].delivered:
                    missing += 1
        return missing

    def quiesce(self) -> tuple[bool, dict]:
        deadline = time.monotonic() + self.args.deadline
        calm = 0
        state: dict = {}
        while time.monotonic() < deadline:
            self.time_machine()
            self.daraja_callbacks()
            state = self.unquiet()
            calm = calm + 1 if not state else 0
            if calm >= 3:
                return True, {}
            time.sleep(1.0)
        return False, state

    # ------------------------------------------------------------ snapshot and report

    def snapshot(self, quiescent: bool, unquiet: dict) -> dict:
        def q(conn):
            from psycopg.rows import dict_row
            out = {}
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                with conn.cursor(row_factory=dict_row) as cur:
                    for key, sql in SNAPSHOT_SQL.items():
                        out[key] = cur.execute(sql).fetchall()
            return out
        snap = self.db.run(q)
        ledger = self.rail_control("GET", "/_chaos/ledger")
        self.ledger = ledger
        snap["rail"] = {
            "transactions": {t["reference"]: ledger_entry(t) for t in ledger["transactions"]},
            "refunds": {t["reference"]: ledger_entry(t) for t in ledger["refunds"]},
        }
        if self.doubles:
            new_ledger, self.new_rail_violations = self.new_rail_ledger()
            snap["rail"]["transactions"].update(new_ledger)
        snap["rail_faults_by_reference"] = ledger.get("faults_by_reference", {})
        snap["rail_reads"] = {t["reference"]: t.get("reads") for t in ledger["transactions"]}
        snap["delivered"] = {r.endpoint_id: sorted(r.delivered) for r in self.receivers.values()}
        snap["bad_signatures"] = [b for r in self.receivers.values() for b in r.bad]
        snap["quiescent"] = quiescent
        snap["unquiet"] = unquiet
        return json.loads(json.dumps(snap, default=str))

    def report(self, snap: dict, violations: list[dict]) -> dict:
        charges = Counter(c["status"] for c in snap["charges"])
        failure_codes = Counter(c["failure_code"] for c in snap["charges"] if c["failure_code"])
        rail_faults = dict(sorted(self.ledger.get("faults", {}).items()))
        receiver_faults = Counter()
        for r in self.receivers.values():
            receiver_faults.update(r.faults)
        by_check = Counter(v["check"] for v in violations)
        return {
            "seed": self.plan.seed,
            "plan_digest": self.plan.digest(),
            "payments": len(self.plan.payments),
            "rate_per_second": self.plan.rate,
            "faults_scheduled": len(self.plan.faults),
            "faults_by_type": self.plan.fault_counts(),
            "faults_applied": dict(sorted(self.applied.items())),
            "faults_skipped": dict(sorted(self.skipped.items())),
            "rail_requests_faulted": rail_faults,
            "receiver_requests_faulted": dict(sorted(receiver_faults.items())),
            "worker_restarts": dict(sorted(self.restarts.items())),
            "callback_answers": {str(k): v for k, v in sorted(self.callback_answers.items(), key=str)},
            "api_answers": {str(k): v for k, v in sorted(self.api_answers.items(), key=str)},
            "payments_created": len(self.created),
            "payments_not_created": len(self.create_failures) + len(self.not_created_held),
            "held_keys": self.held_keys,
            "charges": dict(sorted(charges.items())),
            "failure_codes": dict(sorted(failure_codes.items())),
            "events": len(snap["events"]),
            "events_by_type": dict(sorted(Counter(e["type"] for e in snap["events"]).items())),
            "deliveries_received": sum(r.received for r in self.receivers.values()),
            "deliveries_duplicate": sum(r.duplicates for r in self.receivers.values()),
            "refunds": dict(sorted(Counter(r["status"] for r in snap["refunds"]).items())),
            "refund_cli": dict(sorted(self.refund_results.items())),
            "refund_unexpected": self.refund_unexpected,
            "alerts": dict(sorted(Counter(a["kind"] for a in snap["alerts"]).items())),
            "rail_transactions": dict(sorted(Counter(t["status"] for t in snap["rail"]["transactions"].values())
                                             .items())),
            "rail_requests": self.ledger.get("requests"),
            "charges_by_rail": dict(sorted(Counter(p.rail for p in self.plan.payments
                                                   if p.index in self.created).items())),
            "quiescent": snap["quiescent"],
            "unquiet": snap["unquiet"],
            "times": self.times,
            "load_average": {"start": self.load_start, "max": max(self.loads, default=None),
                             "mean": round(sum(self.loads) / len(self.loads), 2) if self.loads else None,
                             "end": os.getloadavg()[0], "cpus": os.cpu_count()},
            "workdir": str(self.workdir),
            "violations_by_check": dict(sorted(by_check.items())),
            "violations": violations,
            "fault_log": self.fault_log,
        }

    # ------------------------------------------------------------ main

    def run(self) -> int:
        self.load_start = os.getloadavg()[0]
        started = time.monotonic()
        self.setup()
        self.payments_done = threading.Event()
        self.refund_idle = threading.Event()
        self.t0_ref[0] = time.time()
        self.rail_control("POST", "/_chaos/t0", {"t0": self.t0_ref[0]})
        threads = [threading.Thread(target=self._guard, args=(fn,), daemon=True, name=fn.__name__)
                   for fn in (self.run_faults, self.monitor, self.refunder)]
        for t in threads:
            t.start()
        progress = threading.Thread(target=self.progress, daemon=True)
        progress.start()
        t = time.monotonic()
        self.run_payments()
        self.payments_done.set()
        threads[0].join()  # the fault schedule ends within the payment phase
        self.times["payment_phase_seconds"] = round(time.monotonic() - t, 1)
        log(f"payments sent ({len(self.created)} created, {len(self.create_failures)} not); faults over; "
            f"recovering")
        self.recover()
        t = time.monotonic()
        quiet, state = self.quiesce()
        self.times["quiescence_seconds"] = round(time.monotonic() - t, 1)
        log("quiet" if quiet else f"NOT quiet at the deadline: {state}")
        snap = self.snapshot(quiet, state)
        violations = list(self.violations) + chaos_checks.run_all(snap) + self.new_rail_violations
        for index, error in sorted(self.create_failures.items()):
            violations.append({"check": "create", "id": index, "detail": f"payment never created: {error}"})
        for bad in self.refund_unexpected:
            violations.append({"check": "refund_cli", "id": bad["charge"],
                               "detail": f"refund of {bad['amount']} exited {bad['exit']}: {bad['stderr']}"})
        self.times["total_seconds"] = round(time.monotonic() - started, 1)
        report = self.report(snap, violations)
        (self.workdir / "snapshot.json").write_text(json.dumps(snap))
        if self.args.report:
            Path(self.args.report).write_text(json.dumps(report, indent=2, default=str))
        print_report(report)
        return 1 if violations else 0

    def progress(self) -> None:
        while not self.stop_event.wait(self.args.progress_every):
            try:
                rows = self.db.all("SELECT status, count(*) AS n FROM charges GROUP BY status")
                jobs = self.db.all("SELECT count(*) FILTER (WHERE run_at <= now() AND locked_at IS NULL) AS due, "
                                   "count(*) FILTER (WHERE locked_at IS NOT NULL) AS leased FROM jobs")[0]
            except Exception as exc:  # noqa: BLE001 - progress is best effort
                log(f"progress: {exc}")
                continue
            log(f"created {len(self.created)}/{len(self.plan.payments)} "
                f"charges {dict((r['status'], r['n']) for r in rows)} jobs due {jobs['due']} "
                f"leased {jobs['leased']} faults {sum(self.applied.values())}/{len(self.plan.faults)} "
                f"load {os.getloadavg()[0]:.1f}")

    def shutdown(self) -> None:
        self.stop_event.set()
        for t in self.timers:
            t.cancel()
        for proc in self.procs:
            code = proc.terminate()
            if proc.name.startswith("w") and code not in (0, 1, -9, None) and proc is self.workers[int(proc.name[1:])]:
                log(f"{proc.name} exited {code} at shutdown")
        if self.rail_proc is not None and self.rail_proc.poll() is None:
            self.rail_proc.terminate()
            try:
                self.rail_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.rail_proc.kill()
        for r in self.receivers.values():
            r.stop()
        for double in self.doubles.values():
            double.stop()
        if self.pg is not None:
            self.pg.stop()


def ledger_entry(txn: dict) -> dict:
    """One transaction of the rail's ledger as ``chaos_checks`` reads it."""
    return {"status": txn["status"], "reason": txn["reason"], "amount": txn["amount"],
            "transaction_id": txn.get("financialTransactionId")}


SNAPSHOT_SQL = {
    "charges": "SELECT id, payment_intent_id, rail_reference, payer, amount, currency, status, failure_code, "
               "rail_transaction_id, prompt_expired_at IS NOT NULL AS prompt_expired FROM charges ORDER BY id",
    "intents": "SELECT id, merchant_id, status FROM payment_intents ORDER BY id",
    "events": "SELECT id, type, payment_intent_id, data->'charge'->>'id' AS charge_id, "
              "data->'refund'->>'id' AS refund_id, (data->>'expired')::boolean AS expired "
              "FROM events ORDER BY id",
    "refunds": "SELECT id, charge_id, rail_reference, amount, status, failure_code, rail_transaction_id "
               "FROM refunds ORDER BY id",
    "jobs": "SELECT kind, dedupe_key, run_at = 'infinity' AS dead, locked_at IS NOT NULL AS leased, "
            "last_error FROM jobs ORDER BY id",
    "alerts": "SELECT kind, charge_id, refund_id FROM alerts ORDER BY id",
    "audit": "SELECT tbl, row_id, old_status, new_status, what, at FROM chaos_audit ORDER BY id",
    "endpoints": "SELECT id, merchant_id FROM webhook_endpoints ORDER BY id",
}


def print_report(report: dict) -> None:
    print()
    print("=" * 72)
    print(f"chaos run: seed {report['seed']}, {report['payments']} payments at {report['rate_per_second']}/s, "
          f"{report['faults_scheduled']} faults (plan {report['plan_digest'][:16]})")
    for key in ("faults_by_type", "faults_applied", "faults_skipped", "rail_requests_faulted",
                "receiver_requests_faulted", "worker_restarts", "callback_answers", "api_answers", "charges",
                "failure_codes", "events_by_type", "refunds", "refund_cli", "alerts", "rail_transactions",
                "times", "load_average"):
        print(f"  {key}: {json.dumps(report[key])}")
    if report["held_keys"]:
        print(f"  keys the API held in progress after their request died: {json.dumps(report['held_keys'])}")
    print(f"  payments created {report['payments_created']}, not created {report['payments_not_created']}; "
          f"events {report['events']}; deliveries {report['deliveries_received']} "
          f"({report['deliveries_duplicate']} duplicates); rail requests {report['rail_requests']}")
    print(f"  quiescent: {report['quiescent']} {report['unquiet'] or ''}")
    violations = report["violations"]
    print(f"  violations: {len(violations)} {json.dumps(report['violations_by_check'])}")
    for v in violations[:200]:
        print(f"    - [{v['check']}] {v['id']}: {v['detail']}".rstrip())
    if len(violations) > 200:
        print(f"    ... {len(violations) - 200} more in the report file")
    print(f"  workdir: {report['workdir']}")
    print("=" * 72, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/chaos.py", description="vpay's chaos run (issue 12)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--payments", type=int, required=True)
    parser.add_argument("--faults", type=int, default=None,
                        help="scheduled faults [default: max(8, payments // 100)]")
    parser.add_argument("--rate", type=float, default=5.0, help="payments created per second [5]")
    parser.add_argument("--report", default=None, help="write the report here as JSON")
    parser.add_argument("--workdir", default=None, help="[a new temporary folder]")
    parser.add_argument("--keep", action="store_true", help="keep the workdir (logs, snapshot) after a clean run")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds to wait for quiescence [300]")
    parser.add_argument("--print-schedule", action="store_true", help="print the plan's schedule and exit")
    parser.add_argument("--clients", type=int, default=8, help="concurrent API clients [8]")
    parser.add_argument("--worker-concurrency", type=int, default=5, help="per worker [5, the most a worker takes]")
    parser.add_argument("--lease", type=float, default=8.0, help="worker --lease-seconds [8]")
    parser.add_argument("--rail-read-timeout", type=float, default=2.0)
    parser.add_argument("--rail-total-timeout", type=float, default=5.0,
                        help="VPAY_MTN_TOTAL_TIMEOUT_SECONDS of the vpay processes [5]")
    parser.add_argument("--webhook-read-timeout", type=float, default=2.0)
    parser.add_argument("--prompt-ttl", type=int, default=60, help="VPAY_PROMPT_TTL_SECONDS [60]")
    parser.add_argument("--success-after", type=float, default=2.0,
                        help="the rail's success timer for unscripted payers, seconds [2]")
    parser.add_argument("--create-deadline", type=float, default=180.0,
                        help="seconds a payment's creation is retried with its Idempotency-Key [180]")
    parser.add_argument("--in-use-patience", type=float, default=20.0,
                        help="seconds of idempotency_key_in_use before the key is looked up in the "
                             "database (the API holds a key whose request died for 300 s) [20]")
    parser.add_argument("--log-level", default="INFO", help="VPAY_LOG_LEVEL of the vpay processes [INFO]")
    parser.add_argument("--progress-every", type=float, default=10.0)
    parser.add_argument("--rails", default="mtn",
                        help="rails the payments are spread over, comma-separated: mtn, mpesa, pawapay [mtn]; "
                             "mpesa and pawapay run on vpay's own sandboxes in this process (no rail faults)")
    args = parser.parse_args(argv)
    if args.payments < 1 or args.rate <= 0:
        parser.error("--payments must be >= 1 and --rate > 0")
    if args.faults is None:
        args.faults = max(8, args.payments // 100)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = make_plan(args.seed, args.payments, args.faults, args.rate, lease=args.lease,
                         rail_read_timeout=args.rail_read_timeout, webhook_read_timeout=args.webhook_read_timeout,
                         rails=tuple(r.strip() for r in args.rails.split(",") if r.strip()))
    except ValueError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    print(f"plan: seed {plan.seed}, {len(plan.payments)} payments at {plan.rate}/s over {plan.duration:.1f} s, "
          f"{len(plan.faults)} faults {json.dumps(plan.fault_counts())}, digest {plan.digest()}")
    expects = Counter(p.expect for p in plan.payments)
    print(f"plan: rails {dict(sorted(Counter(p.rail for p in plan.payments).items()))}, "
          f"rail outcomes {dict(sorted(expects.items()))}, "
          f"payments with refunds {sum(1 for p in plan.payments if p.refunds)}")
    for fault in plan.faults:
        print(f"  fault {fault.describe()}")
    sys.stdout.flush()
    if args.print_schedule:
        return 0
    chaos = Chaos(args, plan)
    code = 3

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        code = chaos.run()
    except KeyboardInterrupt:
        log("interrupted")
        code = 3
    except Exception:  # noqa: BLE001 - the harness itself failed: say so, exit 3
        traceback.print_exc()
        code = 3
    finally:
        chaos.shutdown()
        if code == 0 and not args.keep and not args.workdir:
            shutil.rmtree(chaos.workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
