"""``vpay-server demo``: the main job, end to end, on one machine.

It starts the sandbox MoMo, M-Pesa and pawaPay rails on free loopback ports, makes a fresh
``vpay_demo`` database on the embedded Postgres (or on the server of
``VPAY_DATABASE_URL``; it never writes into that URL's own database, and
there it drops only a ``vpay_demo`` it made itself, marked by a comment on
the database: another one is refused unless ``--reset``), runs
the API (``vpay-server api``: MoMo's callbacks land there and pull polls
forward), a merchant's webhook receiver that verifies every signature with
the Standard Webhooks library, and the real ``vpay-worker``; creates a batch
of payments across the sandbox's behaviours, shows live progress, and prints
a table. It exits 0 only if every charge ended as the sandbox scripted it,
every event reached the receiver with a valid signature, and the worker
drained cleanly.

With ``console_bind`` (``--console``) it also runs the operator console
(``vpay-server console``) on that address from the start, creates an admin
operator with a one-time password and prints the login; after the report
the console stays up on the demo's database until SIGINT (Ctrl-C) or
SIGTERM, which end the demo with the run's exit code. ``quick``
(``--quick``) runs a handful of payments (``QUICK``) instead of the batch.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

DEMO_DB = "vpay_demo"
MARK = "made by vpay-server demo; dropped and made again by each demo run"
"""The comment a database the demo made carries: the only kind it drops
unasked on a server it does not own."""


class DemoRefused(Exception):
    """The demo will not drop a database it did not make (exit 1)."""


@dataclass(frozen=True)
class Scenario:
    """One payment of the batch: what the sandbox is told to do, and the
    state vpay must reach (``pending`` = still polling at the end, as for
    MoMo's not-final ONGOING / PAYER_DELAYED)."""

    label: str
    payer: str
    expect: str
    reason: str | None = None
    script: dict[str, Any] | None = None
    rail: str = "mtn"


# One payment per new rail per scripted outcome (issue 29): the sandboxes'
# scripts (vpay/sandbox/mpesa.py, pawapay.py), amounts in each rail's currency.
RAIL_MONEY = {"mtn": ("EUR", 1000, 50), "mpesa": ("KES", 100_00, 100), "pawapay": ("ZMW", 10_00, 50)}
NEW_RAIL_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("M-Pesa: approves", "254700000001", "succeeded", script={"outcome": "approve"}, rail="mpesa"),
    Scenario("M-Pesa: cancels the prompt", "254700000002", "failed", "MPESA_1032",
             script={"outcome": "decline"}, rail="mpesa"),
    Scenario("M-Pesa: unreachable, prompt expires", "254700000003", "failed", "MPESA_1037",
             script={"outcome": "expire"}, rail="mpesa"),
    Scenario("M-Pesa: in flight x2, then approves", "254700000004", "succeeded",
             script={"outcome": "approve", "in_flight": 2}, rail="mpesa"),
    Scenario("M-Pesa: never answers (in flight)", "254700000005", "pending",
             script={"outcome": "never"}, rail="mpesa"),
    Scenario("pawaPay: approves", "260760000001", "succeeded", script={"outcome": "approve"}, rail="pawapay"),
    Scenario("pawaPay: declines", "260760000002", "failed", "INSUFFICIENT_BALANCE",
             script={"outcome": "decline"}, rail="pawapay"),
    Scenario("pawaPay: prompt lapses", "260760000003", "failed", "PAYMENT_NOT_APPROVED",
             script={"outcome": "expire"}, rail="pawapay"),
    Scenario("pawaPay: pending x2, then approves", "260760000004", "succeeded",
             script={"outcome": "approve", "in_flight": 2}, rail="pawapay"),
    Scenario("pawaPay: never answers (submitted)", "260760000005", "pending",
             script={"outcome": "never"}, rail="pawapay"),
)


SCENARIOS: tuple[Scenario, ...] = (
    *(Scenario("approves", f"25677000010{i}", "succeeded") for i in range(8)),
    Scenario("declines on the phone", "46733123451", "failed", "APPROVAL_REJECTED"),
    Scenario("lets the prompt expire", "46733123452", "failed", "EXPIRED"),
    Scenario("unknown payer", "46733123455", "failed", "PAYER_NOT_FOUND"),
    Scenario("did not approve in time", "46733123463", "failed", "COULD_NOT_PERFORM_TRANSACTION"),
    Scenario("rail internal error", "46733123450", "failed", "INTERNAL_PROCESSING_ERROR"),
    Scenario("rail says ONGOING: not final", "46733123453", "pending"),
    Scenario("rail says PAYER_DELAYED: not final", "46733123454", "pending"),
    Scenario("approves after 2 pending reads", "256770000201", "succeeded",
             script={"pending_reads": 2, "outcome": "SUCCESSFUL"}),
    Scenario("declines after 1 pending read", "256770000202", "failed", "APPROVAL_REJECTED",
             script={"pending_reads": 1, "outcome": "FAILED", "reason": "APPROVAL_REJECTED"}),
    Scenario("status read answers 500, then 503", "256770000203", "succeeded",
             script={"status_errors": [500, 503], "pending_reads": 0, "outcome": "SUCCESSFUL"}),
    Scenario("request-to-pay lost: resubmitted", "256770000204", "succeeded",
             script={"rtp_errors": [500]}),
    *NEW_RAIL_SCENARIOS,
)


QUICK: tuple[Scenario, ...] = (SCENARIOS[0], SCENARIOS[1], SCENARIOS[8], NEW_RAIL_SCENARIOS[0],
                                NEW_RAIL_SCENARIOS[5])
"""``--quick``: two MoMo approvals, a decline, M-Pesa and pawaPay approving:
a look at every rail (and at the console) in seconds, not the whole batch."""

DEMO_OPERATOR = "demo@example.com"
"""The console's operator the demo creates (role admin), a new one-time
password each run: the demo's database is made again each run."""


class _Stopped(Exception):
    """SIGTERM (or SIGINT) asked the demo to end: children are stopped in order."""


def _stop_on_signals() -> dict:
    """SIGTERM and SIGINT raise ``_Stopped`` in the main thread (so every
    ``finally`` runs and the children end); answers the old handlers."""
    def stop(signum, frame):
        raise _Stopped(signal.Signals(signum).name)
    return {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}


def _database(server_url: str, name: str = DEMO_DB, *, owned_server: bool = False,
              reset: bool = False) -> str:
    """A fresh database ``name`` on ``server_url``'s server, migrated. An
    existing one is dropped first only when the demo made it (``MARK``), the
    server is the demo's own (``owned_server``: the embedded default), or
    ``reset``; otherwise ``DemoRefused``, and nothing is touched."""
    from vpay.base.db import connect, migrate
    admin_url = psycopg.conninfo.make_conninfo(server_url, dbname="postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        found = admin.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database "
                              "WHERE datname = %s", (name,)).fetchone()
        if found is not None and found[0] != MARK and not (owned_server or reset):
            raise DemoRefused(f"database {name} exists on this server and was not made by "
                              f"vpay-server demo; drop it yourself, or pass --reset to let the demo drop it")
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(MARK)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
    with connect(url) as conn:
        migrate(conn)
    return url


def _console(name: str) -> list[str]:
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from vpay.cli import worker_main; sys.exit(worker_main())"]


class Receiver:
    """The merchant's webhook endpoint: a real HTTP server on loopback that
    verifies each POST on its raw bytes (``standardwebhooks.Webhook``) and
    keeps the event ids it accepted (at-least-once: it dedupes on them)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.secret: str | None = None
        self.events: dict[str, str] = {}
        self.bad = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # the demo's output is its live view
                pass

            def do_POST(self):
                from standardwebhooks import Webhook
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    event = Webhook(receiver.secret).verify(body, dict(self.headers))
                except Exception:  # noqa: BLE001 - any verification failure is a bad delivery
                    with receiver._lock:
                        receiver.bad += 1
                    self.send_response(400)
                else:
                    with receiver._lock:
                        receiver.events[event["id"]] = event["type"]
                    self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/webhooks"

    def start(self) -> "Receiver":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _demo_keys(data_dir: Path) -> None:
    """The demo's own VPAY_SECRET_KEYS (webhook secrets are sealed under it,
    vpay.base.secretbox) unless the environment names keys: made once and
    kept in ``data_dir/secret-keys`` (mode 0600), so a kept demo database
    opens on the next run. Set in this process's environment, which the
    API and the worker inherit."""
    from vpay.base.secretbox import KEYS_ENV, KEYS_FILE_ENV, new_key
    if os.environ.get(KEYS_ENV, "").strip() or os.environ.get(KEYS_FILE_ENV, "").strip():
        return
    path = data_dir / "secret-keys"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_key() + "\n")
    os.environ[KEYS_ENV] = path.read_text().strip()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 30.0, path: str = "/healthz") -> bool:
    import requests
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(f"{url}{path}", timeout=1).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.2)
    return False


def _counts(conn, ids: list[str]) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM charges WHERE id = ANY(%s) GROUP BY 1", (ids,)).fetchall()
    return dict(rows)


def run(*, deadline_seconds: float, out=sys.stdout, database: str = DEMO_DB, reset: bool = False,
        console_bind: str | None = None, quick: bool = False) -> int:
    """Run the demo; answers the process exit code (0 = every charge as
    scripted). Raises ``DemoRefused`` (before starting anything) when
    ``database`` exists on ``VPAY_DATABASE_URL``'s server, was not made by
    the demo, and ``reset`` is not given. ``console_bind`` (HOST:PORT, a
    loopback address: the cookie goes without TLS): the console runs there
    and stays up after the report until SIGINT/SIGTERM. ``quick``: the
    ``QUICK`` scenarios only."""
    from vpay.base.db import database_url, make_pool
    from vpay.money.merchants import create_merchant
    from vpay.money.payments import create_and_submit
    from vpay.rails.mpesa import MpesaDaraja
    from vpay.rails.mtn import MtnMomo
    from vpay.rails.pawapay import PawaPay
    from vpay.sandbox.mpesa import MpesaSandbox
    from vpay.sandbox.mtn import SandboxRail
    from vpay.sandbox.pawapay import PawaPaySandbox

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    # The live view is the demo's output; per-request rail lines would drown it.
    for name in ("vpay.sandbox.mtn", "vpay.sandbox.mpesa", "vpay.sandbox.pawapay"):
        logging.getLogger(name).setLevel(logging.WARNING)
    started = time.monotonic()
    server = database_url()
    url = _database(server, database, owned_server=not os.environ.get("VPAY_DATABASE_URL", "").strip(),
                    reset=reset)
    data_dir = Path(os.environ.get("VPAY_DATA_DIR", "./.vpay")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    worker_log = data_dir / "demo-worker.log"
    api_log = data_dir / "demo-api.log"

    scenarios = QUICK if quick else SCENARIOS
    rail = SandboxRail(success_after_seconds=3.0).start()
    doubles = {"mtn": rail, "mpesa": MpesaSandbox().start(), "pawapay": PawaPaySandbox().start()}
    for s in scenarios:
        if s.script and s.rail == "mtn":
            rail.script(s.payer, **s.script)
        elif s.script:
            doubles[s.rail].script_payer(s.payer, **s.script)
    api_url = f"http://127.0.0.1:{_free_port()}"
    rail_env = {"VPAY_MTN_BASE_URL": rail.url, "VPAY_MTN_SUBSCRIPTION_KEY": rail.subscription_key,
                "VPAY_MTN_API_USER": rail.api_user, "VPAY_MTN_API_KEY": rail.api_key,
                "VPAY_MTN_TARGET_ENVIRONMENT": rail.target_environment,
                "VPAY_MTN_CALLBACK_URL": f"{api_url}/provider/mtn/callback",
                **doubles["mpesa"].env(f"{api_url}/provider/mpesa/callback"), **doubles["pawapay"].env()}
    say(f"vpay demo: sandbox rails MoMo {rail.url}, M-Pesa {doubles['mpesa'].url}, "
        f"pawaPay {doubles['pawapay'].url}; database {database} "
        f"({'VPAY_DATABASE_URL' if os.environ.get('VPAY_DATABASE_URL') else 'embedded, ' + str(data_dir)})")
    _demo_keys(data_dir)
    env = {**os.environ, **rail_env, "VPAY_DATABASE_URL": url, "PYTHONUNBUFFERED": "1",
           # the receiver below is on loopback: a development-only permission
           "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1"}

    pool = make_pool(url, max_size=3)
    receiver = Receiver().start()
    worker = api = console = None
    old_handlers = _stop_on_signals()
    try:
        if console_bind is not None:
            console = _start_console(say, pool, env, console_bind, data_dir / "demo-console.log")
            if console is None:
                return 1
        with open(api_log, "wb") as log_file:
            api = subprocess.Popen(_console("vpay-server") + ["api", "--bind", api_url[len("http://"):]],
                                   env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
        if not _wait_healthy(api_url, api):
            say(f"the API did not come up; see {api_log}")
            return 1
        say(f"API at {api_url} (MoMo callbacks land here), log {api_log}")
        from vpay.webhooks import add_endpoint
        with pool.connection() as conn:
            create_merchant(conn, "demo", "Demo merchant")
            endpoint = add_endpoint(conn, "demo", receiver.url, permit_private=True)
        receiver.secret = endpoint["secret"]
        say(f"merchant webhook receiver at {receiver.url} (verifies every signature)")
        adapters = {"mtn": MtnMomo.from_env(rail_env), "mpesa": MpesaDaraja.from_env(rail_env),
                    "pawapay": PawaPay.from_env(rail_env)}
        batch: list[tuple[Scenario, dict[str, Any]]] = []
        for i, s in enumerate(scenarios):
            currency, base, step = RAIL_MONEY[s.rail]
            created = create_and_submit(pool, adapters.__getitem__, merchant_id="demo",
                                        amount=base + step * i, currency=currency, rail=s.rail,
                                        payer=s.payer, description=f"demo {i + 1}: {s.label}")
            batch.append((s, created["charge"]))
        ids = [c["id"] for _, c in batch]
        say(f"created {len(batch)} payments; starting vpay-worker (log: {worker_log})")

        with open(worker_log, "wb") as log_file:
            worker = subprocess.Popen(_console("vpay-worker") + ["--worker-concurrency", "4"],
                                      env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        expected_final = sum(1 for s, _ in batch if s.expect != "pending")
        deadline = time.monotonic() + deadline_seconds
        last = ""
        while True:
            with pool.connection() as conn:
                counts = _counts(conn, ids)
            terminal = counts.get("succeeded", 0) + counts.get("failed", 0)
            line = (f"  t={time.monotonic() - started:5.1f}s  pending {counts.get('pending', 0):2d}  "
                    f"succeeded {counts.get('succeeded', 0):2d}  failed {counts.get('failed', 0):2d}  "
                    f"rail requests {sum(len(d.requests_log()) for d in doubles.values()):3d}")
            if line[12:] != last:
                say(line)
                last = line[12:]
            if terminal >= expected_final:
                with pool.connection() as conn:
                    events = conn.execute(EVENTS_OF_BATCH, (ids,)).fetchone()[0]
                if len(receiver.events) >= events or time.monotonic() > deadline:
                    break
            elif time.monotonic() > deadline:
                break
            if worker.poll() is not None:
                say(f"vpay-worker exited early with {worker.returncode}; see {worker_log}")
                break
            time.sleep(1.0)

        worker.send_signal(signal.SIGTERM)
        worker_rc = worker.wait(60)
        code = _report(say, pool, doubles, receiver, batch, worker_rc, time.monotonic() - started)
        if console is not None:
            _keep_console_up(say, console, console_bind)
        return code
    except _Stopped as stopped:  # after the report, _keep_console_up swallows it
        say(f"stopped by {stopped} before the run ended")
        return 1
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        for proc in (worker, api, console):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        pool.close()
        receiver.stop()
        for double in doubles.values():
            double.stop()


def _start_console(say, pool, env: dict, bind: str, log_path: Path) -> subprocess.Popen | None:
    """``vpay-server console`` on ``bind`` (loopback, the cookie without
    TLS) on the demo's database, and its admin operator with a one-time
    password, printed once. Answers the process, or None (said why) when it
    did not come up."""
    from vpay.console.accounts import create_operator, new_password
    password = new_password()
    with pool.connection() as conn:
        create_operator(conn, DEMO_OPERATOR, "admin", password)
    with open(log_path, "wb") as log_file:
        console = subprocess.Popen(_console("vpay-server") + ["console", "--bind", bind, "--insecure-cookie"],
                                   env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://{bind}"
    if not _wait_healthy(url, console, path="/login"):
        say(f"the console did not come up on {bind}; see {log_path}")
        return None
    say(f"console at {url} (log {log_path}): sign in as {DEMO_OPERATOR} "
        f"with the one-time password {password}")
    return console


def _keep_console_up(say, console: subprocess.Popen, bind: str) -> None:
    """Wait until SIGINT/SIGTERM (``_Stopped``, swallowed: the run's exit
    code stands) or the console's own end."""
    say(f"the console stays up at http://{bind}: Ctrl-C or SIGTERM ends the demo")
    try:
        while console.poll() is None:
            time.sleep(0.5)
        say(f"the console exited with {console.returncode}")
    except _Stopped as stopped:
        say(f"stopped by {stopped}; ending the console")


EVENTS_OF_BATCH = ("SELECT count(*) FROM events e JOIN charges c ON c.payment_intent_id = e.payment_intent_id "
                   "WHERE c.id = ANY(%s)")


def _status_reads(doubles, s: Scenario, reference: str) -> int:
    """How many status reads the scenario's rail answered for ``reference``."""
    if s.rail == "mpesa":
        return doubles["mpesa"].count("/query", reference=reference)
    if s.rail == "pawapay":
        return doubles["pawapay"].count("GET", "/v2/deposits/", reference)
    return doubles["mtn"].count(method="GET", reference=reference)


def _report(say, pool, doubles, receiver, batch, worker_rc: int, elapsed: float) -> int:
    rail = doubles["mtn"]
    with pool.connection() as conn:
        rows = {r[0]: r for r in conn.execute(
            "SELECT id, status, failure_code, EXTRACT(EPOCH FROM settled_at - created_at) "
            "FROM charges WHERE id = ANY(%s)", ([c["id"] for _, c in batch],)).fetchall()}
        events = conn.execute(EVENTS_OF_BATCH, ([c["id"] for _, c in batch],)).fetchone()[0]
    say("")
    say(f"{'charge':<28} {'payer':<13} {'scenario':<36} {'status':<10} {'reason':<30} "
        f"{'polls':>5} {'settle s':>8}  ok")
    good = 0
    for s, c in batch:
        _, status, reason, secs = rows[c["id"]]
        polls = _status_reads(doubles, s, c["rail_reference"])
        ok = status == s.expect and (reason == s.reason)
        good += ok
        say(f"{c['id']:<28} {s.payer:<13} {s.label:<36} {status:<10} {reason or '-':<30} "
            f"{polls:>5} {(f'{secs:.1f}' if secs is not None else '-'):>8}  {'yes' if ok else 'NO'}")
    requests = rail.requests_log()
    by_kind = {
        "token": sum(1 for r in requests if r["path"].startswith("/collection/token")),
        "request-to-pay": sum(1 for r in requests if r["method"] == "POST" and "requesttopay" in r["path"]),
        "status": sum(1 for r in requests if r["method"] == "GET"),
    }
    say("")
    callbacks = len(rail.callbacks())
    say(f"MoMo requests: {len(requests)} ({', '.join(f'{k} {v}' for k, v in by_kind.items())}); "
        f"callbacks sent by the rail: {callbacks}; M-Pesa requests: {len(doubles['mpesa'].requests_log())}; "
        f"pawaPay requests: {len(doubles['pawapay'].requests_log())}")
    say(f"events written: {events}; webhooks received with a valid signature: {len(receiver.events)} "
        f"(bad signatures: {receiver.bad}); worker drained with exit {worker_rc}; {elapsed:.0f}s in all")
    ok = good == len(batch) and worker_rc == 0 and len(receiver.events) == events and receiver.bad == 0
    say(f"{good}/{len(batch)} charges ended as the sandbox scripted them: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1
