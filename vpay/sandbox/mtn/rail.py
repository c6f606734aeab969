"""``SandboxRail``: the MoMo sandbox put together: its configuration
(credentials per product, target environment, timers, reason shape,
callback rules, accounts), its state, and the parts it is made of (the
lifecycle of ``server.ServedDouble``, ``routes``, ``auth``,
``transactions`` for ``collection`` and ``disbursement``, ``accounts``,
``control``, ``ledger``)."""

from __future__ import annotations

import itertools
import logging
import re
import threading
from collections import deque
from typing import Any, Iterable

from vpay.sandbox.server import ServedDouble
from vpay.sandbox.mtn.accounts import Accounts
from vpay.sandbox.mtn.auth import Auth
from vpay.sandbox.mtn.codes import AMOUNT_RE, DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_OPENING_BALANCE, DEFAULT_SUBSCRIPTION_KEY, SANDBOX_CURRENCY
from vpay.sandbox.mtn.control import Control
from vpay.sandbox.mtn.ledger import Ledger, _Txn
from vpay.sandbox.mtn.routes import Routes, _Handler
from vpay.sandbox.mtn.scripts import _Script
from vpay.sandbox.mtn.transactions import Transactions

log = logging.getLogger("vpay.sandbox.mtn")


class SandboxRail(Routes, Auth, Transactions, Accounts, Control, Ledger, ServedDouble):
    """A local MTN MoMo Collection and Disbursement double (see
    ``vpay.sandbox.mtn``).

    Use as ``with SandboxRail(success_after_seconds=0.2) as rail: ...`` (starts
    a background server on 127.0.0.1 and an ephemeral port; ``rail.url`` is the
    MoMo base URL), or ``start()``/``stop()``, or ``serve_forever()`` from a CLI.
    The socket is bound in the constructor, so ``url`` is valid at once; a
    stopped rail cannot be started again.
    """

    label = "MoMo sandbox"
    thread_prefix = "momo-sandbox"
    lifecycle_log = log

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        subscription_key: str = DEFAULT_SUBSCRIPTION_KEY,
        api_user: str = DEFAULT_API_USER,
        api_key: str = DEFAULT_API_KEY,
        target_environment: str = "sandbox",
        success_after_seconds: float = 3.0,
        token_ttl_seconds: int = 3600,
        reason_shape: str = "string",
        callback_method: str = "POST",
        callback_hosts: Iterable[str] | None = None,
        max_log_entries: int = 100_000,
        disbursement_subscription_key: str | None = None,
        disbursement_api_user: str | None = None,
        disbursement_api_key: str | None = None,
        opening_balance: str = DEFAULT_OPENING_BALANCE,
        account_currency: str = SANDBOX_CURRENCY,
    ) -> None:
        if reason_shape not in ("object", "string"):
            raise ValueError("reason_shape must be 'object' or 'string'")
        if not isinstance(opening_balance, str) or not AMOUNT_RE.match(opening_balance):
            raise ValueError("opening_balance must be a non-negative decimal string, e.g. '1000.00'")
        if not re.fullmatch(r"[A-Z]{3}", account_currency or ""):
            raise ValueError("account_currency must be an ISO 4217 code")
        if target_environment == "sandbox" and account_currency != SANDBOX_CURRENCY:
            raise ValueError(f"the sandbox target environment has {SANDBOX_CURRENCY} accounts only")
        if callback_method not in ("POST", "PUT"):
            raise ValueError("callback_method must be 'POST' or 'PUT'")
        if success_after_seconds < 0 or token_ttl_seconds <= 0:
            raise ValueError("success_after_seconds must be >= 0 and token_ttl_seconds > 0")
        self.subscription_key = subscription_key
        self.api_user = api_user
        self.api_key = api_key
        #: the Disbursement product's credentials (refunds); default: the Collection ones
        self.disbursement_subscription_key = disbursement_subscription_key or subscription_key
        self.disbursement_api_user = disbursement_api_user or api_user
        self.disbursement_api_key = disbursement_api_key or api_key
        self.target_environment = target_environment
        self.success_after_seconds = float(success_after_seconds)
        self.token_ttl_seconds = token_ttl_seconds
        self.reason_shape = reason_shape
        #: each account's balance before any transaction (major units, decimal string)
        self.opening_balance = opening_balance
        #: the currency of both accounts (the balance counts transactions in it only)
        self.account_currency = account_currency
        self.callback_method = callback_method
        #: None = loopback hosts only; "*" in the collection = any host.
        self.callback_hosts = None if callback_hosts is None else frozenset(h.lower() for h in callback_hosts)

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._tokens: dict[str, float] = {}  # sha256(token) -> monotonic expiry
        self._disbursement_tokens: dict[str, float] = {}  # the same, for the Disbursement product
        self._txns: dict[str, _Txn] = {}
        self._refunds: dict[str, _Txn] = {}  # refunds by their X-Reference-Id
        self._scripts: dict[str, _Script] = {}
        self._log: deque[dict[str, Any]] = deque(maxlen=max_log_entries)
        self._callbacks: deque[dict[str, Any]] = deque(maxlen=max_log_entries)
        self._timers: list[tuple[float, int, str, _Txn]] = []
        self._seq = itertools.count()
        self._timer_thread: threading.Thread | None = None
        self._bind(host, port, _Handler)
