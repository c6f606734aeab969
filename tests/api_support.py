"""Shared by the API tests: a sandbox MoMo rail in the test process, a real
`vpay-server api` (gunicorn) on a free loopback port, merchant keys, and
snapshots of the tables a request must not touch.

Fixtures are imported by the test modules that use them
(``from api_support import api_stack  # noqa: F401``)."""

from __future__ import annotations

import json
import socket
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import pytest
import requests

from support import Proc, base_env, script, wait_until
from vpay.money import merchants, charges
from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY, SandboxRail

MERCHANT = "shop-1"
OTHER = "shop-2"


def free_port() -> int:
    """A loopback port free right now (bound then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mtn_env(rail: SandboxRail, api_port: int | None) -> dict[str, str]:
    env = {"VPAY_MTN_BASE_URL": rail.url, "VPAY_MTN_SUBSCRIPTION_KEY": DEFAULT_SUBSCRIPTION_KEY,
           "VPAY_MTN_API_USER": DEFAULT_API_USER, "VPAY_MTN_API_KEY": DEFAULT_API_KEY}
    if api_port is not None:
        env["VPAY_MTN_CALLBACK_URL"] = f"http://127.0.0.1:{api_port}/provider/mtn/callback"
    return env


@dataclass
class ApiStack:
    """A running API (``url``) and the sandbox rail it and the worker talk to."""

    url: str
    port: int
    rail: SandboxRail
    proc: Proc
    db_url: str
    own_rail: bool = True
    """Whether stopping the API stops the rail too (``start_api`` made it)."""

    def env(self) -> dict[str, str]:
        """The environment for a worker talking to the same database and rail."""
        return base_env(self.db_url, **mtn_env(self.rail, self.port))

    def create(self, key: str, payer: str = "256770000001", amount: int = 1500, currency: str = "EUR",
               idempotency_key: str | None = None, **extra) -> requests.Response:
        headers = {"Authorization": f"Bearer {key}"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        body = {"amount": amount, "currency": currency,
                "payment_method": {"type": "mtn_momo", "msisdn": payer}, **extra}
        return requests.post(f"{self.url}/v1/payment_intents", json=body, headers=headers, timeout=30)

    def callback(self, reference: str, body: bytes | dict | None = None, method: str = "POST",
                 code: str = "mtn") -> requests.Response:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        return requests.request(method, f"{self.url}/provider/{code}/callback",
                                params={"ref": reference}, data=data,
                                headers={"Content-Type": "application/json"}, timeout=10)


def start_api(db_url: str, log_dir, *, rail: SandboxRail | None = None, workers: int = 2,
              threads: int = 4, **env: str) -> ApiStack:
    """A sandbox rail (``rail``, else a new one, stopped with the API) and a
    real `vpay-server api` on a free loopback port, answering /healthz;
    ``env`` adds settings (``VPAY_HTTP_*``, ...). Stop it with ``stop_api``."""
    own_rail = rail is None
    rail = rail or SandboxRail(success_after_seconds=1.0).start()
    port = free_port()
    proc = Proc([script("vpay-server"), "api", "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
                 "--threads", str(threads)], base_env(db_url, **mtn_env(rail, port), **env),
                log_dir / "vpay-server-api.log")
    url = f"http://127.0.0.1:{port}"

    def healthy():
        if proc.popen.poll() is not None:
            raise AssertionError(f"vpay-server api exited {proc.popen.returncode}:\n{proc.text()[-4000:]}")
        try:
            return requests.get(f"{url}/healthz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_until(healthy, timeout=30, what="the API to answer /healthz")
    except BaseException:
        proc.close()
        if own_rail:
            rail.stop()
        raise
    return ApiStack(url=url, port=port, rail=rail, proc=proc, db_url=db_url, own_rail=own_rail)


def stop_api(stack: ApiStack) -> None:
    """Stop what ``start_api`` started (the rail only when it made it)."""
    stack.proc.close()
    if stack.own_rail:
        stack.rail.stop()


@contextmanager
def running_api(db_url: str, log_dir, rail: SandboxRail | None = None, **extra_env: str):
    """``start_api`` until the block ends. Yields an ``ApiStack``."""
    stack = start_api(db_url, log_dir, rail=rail, **extra_env)
    try:
        yield stack
    finally:
        stop_api(stack)


@pytest.fixture(scope="module")
def api_stack(db_url, tmp_path_factory):
    """One sandbox rail and one `vpay-server api` for the module (state lives
    in the database, which ``db`` empties before each test)."""
    with running_api(db_url, tmp_path_factory.mktemp("api")) as stack_:
        yield stack_


@pytest.fixture
def stack(api_stack, db):
    """``api_stack`` with an empty database and a reset rail."""
    api_stack.rail.reset()
    return api_stack


def new_key(conn: psycopg.Connection, merchant_id: str = MERCHANT) -> str:
    """Create ``merchant_id`` if needed and answer a fresh secret key."""
    merchants.create_merchant(conn, merchant_id, merchant_id)
    return merchants.create_api_key(conn, merchant_id)[1]


def charge_of(conn: psycopg.Connection, intent_id: str) -> dict:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM charges WHERE payment_intent_id = %s", (intent_id,)).fetchone()


def make_payment(conn: psycopg.Connection, merchant_id: str = MERCHANT, payer: str = "256770000001") -> dict:
    """A payment written straight by the state machine (no rail call): the charge row."""
    merchants.create_merchant(conn, merchant_id, merchant_id)
    created = charges.create_payment(conn, merchant_id=merchant_id, amount=1000, currency="EUR",
                                   rail="mtn", payer=payer)
    return created.charge


SNAPSHOT_TABLES = {
    "payment_intents": "SELECT * FROM payment_intents ORDER BY id",
    "charges": "SELECT * FROM charges ORDER BY id",
    "events": "SELECT * FROM events ORDER BY id",
    "jobs": "SELECT id, kind, dedupe_key, payload, run_at::text, attempts, failures, locked_by, locked_at, "
            "last_error FROM jobs ORDER BY id",
    "alerts": "SELECT * FROM alerts ORDER BY id",
    "merchants": "SELECT * FROM merchants ORDER BY id",
    "merchant_api_keys": "SELECT * FROM merchant_api_keys ORDER BY id",
    "idempotency_keys": "SELECT * FROM idempotency_keys ORDER BY merchant_id, key",
}


def snapshot(conn: psycopg.Connection, *tables: str) -> dict[str, list[tuple]]:
    """Every row of ``tables`` (default: all the API can touch), for "changed nothing"."""
    return {t: conn.execute(SNAPSHOT_TABLES[t]).fetchall() for t in (tables or SNAPSHOT_TABLES)}


def random_reference() -> str:
    return str(uuid.uuid4())
