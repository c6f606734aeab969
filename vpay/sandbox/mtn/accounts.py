"""The MoMo sandbox's account endpoints, served by both products
(``{product}``: ``collection`` or ``disbursement``, each with its own token
and subscription key, and the target environment, like every other call):

    GET  {base}/{product}/v1_0/account/balance[/{currency}]
        -> 200 {availableBalance: "decimal string", currency}: ``opening_balance`` plus the
        SUCCESSFUL collections (Collection) or minus the SUCCESSFUL refunds (Disbursement)
        in ``account_currency`` (EUR); another {currency} -> 500 INVALID_CURRENCY
    GET  {base}/{product}/v1_0/accountholder/{msisdn|email}/{accountHolderId}/active
        -> 200 {"result": true|false}: false for 46733123455 (PAYER_NOT_FOUND) and for a
        payer scripted ``active=False``; 400 BAD_REQUEST for another id type or a bad id

The ``Accounts`` mixin needs ``Auth``, ``Ledger`` and the rail's
``opening_balance``, ``account_currency`` and ``_scripts``."""

from __future__ import annotations

import re
import urllib.parse
from decimal import Decimal, InvalidOperation
from typing import Any

from vpay.sandbox.server import Answer
from vpay.sandbox.mtn.codes import COLLECTION, DISBURSEMENT, SANDBOX_FAILURES, SUCCESSFUL, _error

BALANCE_RE = re.compile(r"^/(collection|disbursement)/v1_0/account/balance(?:/([^/]+))?/?$")
HOLDER_RE = re.compile(r"^/(collection|disbursement)/v1_0/accountholder/([^/]+)/([^/]+)/active/?$")
_MSISDN_RE = re.compile(r"^\+?[0-9]{5,15}$")  # ITU-T E.164: at most 15 digits
_EMAIL_RE = re.compile(r"^[^@\s/]+@[^@\s/]+\.[^@\s/]+$")


class Accounts:
    """Balance and account-holder checks."""

    def _balance(self, headers: Any, product: str, currency: str | None) -> Answer:
        """``GET /{product}/v1_0/account/balance[/{currency}]``. Another
        ``currency`` in the path: 500 ``INVALID_CURRENCY`` (MTN's "Currency
        not supported on the requested account")."""
        err = self._product_checks(headers, product)
        if err:
            return err
        if currency is not None and urllib.parse.unquote(currency) != self.account_currency:
            return _error(500, "INVALID_CURRENCY", "Currency not supported on the requested account")
        return Answer(200, {"availableBalance": self.balance(product), "currency": self.account_currency})

    def balance(self, product: str = COLLECTION) -> str:
        """The ``availableBalance`` the balance endpoint of ``product``
        (``"collection"`` or ``"disbursement"``) answers now, as a decimal string."""
        if product not in (COLLECTION, DISBURSEMENT):
            raise ValueError("product must be 'collection' or 'disbursement'")
        self._fire_due_timers()
        total = Decimal(self.opening_balance)
        with self._lock:
            table, sign = (self._txns, 1) if product == COLLECTION else (self._refunds, -1)
            for txn in table.values():
                if txn.status == SUCCESSFUL and txn.currency == self.account_currency:
                    try:
                        total += sign * Decimal(txn.amount)
                    except InvalidOperation:  # an amount forced through set_status
                        continue
        return str(total)

    def _account_holder(self, headers: Any, product: str, id_type: str, holder: str) -> Answer:
        """``GET /{product}/v1_0/accountholder/{accountHolderIdType}/{accountHolderId}/active``.
        ``accountHolderIdType`` is ``msisdn`` (E.164 digits) or ``email``, in
        small letters as MTN's docs require; anything else is 400
        ``BAD_REQUEST``. A script's ``active`` wins over the default."""
        err = self._product_checks(headers, product)
        if err:
            return err
        if id_type == "msisdn":
            if not _MSISDN_RE.match(holder):
                return _error(400, "BAD_REQUEST", "accountHolderId must be an MSISDN (ITU-T E.164)")
            holder = holder.lstrip("+")
        elif id_type == "email":
            if not _EMAIL_RE.match(holder):
                return _error(400, "BAD_REQUEST", "accountHolderId must be an e-mail address")
        else:
            return _error(400, "BAD_REQUEST", "accountHolderIdType must be msisdn or email (small letters)")
        with self._lock:
            script = self._scripts.get(holder)
            scripted = script.active if script else None
        active = scripted if scripted is not None else SANDBOX_FAILURES.get(holder) != "PAYER_NOT_FOUND"
        return Answer(200, {"result": active})
