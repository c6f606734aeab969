"""The rail port: the one interface every mobile-money rail adapter implements.

The design page ("Callbacks are hints") fixes two rules that this module's
types enforce:

* Only an authenticated status query moves money. ``Rail.status`` is the only
  method whose answer can carry a terminal outcome.
* A callback carries identifiers only. ``CallbackIds`` has no field that could
  hold a status, so no caller of ``parse_callback`` can act on one.

Amounts are integers in the currency's minor unit throughout.
"""

from __future__ import annotations

import re

import enum
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from vpay.base.settings import env_seconds



KNOWN_RAILS = ("mtn", "orange", "mpesa", "pawapay")
"""Rails a charge may name: MTN MoMo (``vpay.rails.mtn``), Orange Money Web
Payment (``vpay.rails.orange``), M-Pesa Daraja STK Push (``vpay.rails.mpesa``)
and pawaPay (``vpay.rails.pawapay``). A known rail may still be unconfigured
in a given process: ``vpay.rails.build_rail`` then raises ``RailError``. Each
is also a lane (``vpay.money.lanes``) and a value the ``rail`` / ``lane``
CHECKs accept (``sql/0021_mpesa_pawapay.sql``)."""

REFUNDS_REFUSED = {
    "mpesa": "M-Pesa refunds are not supported: Daraja's reversal answers only through a "
             "callback, so no status read could ever settle one; refund the payer another way",
}
"""Rails whose refunds are refused at creation (``refunds.create_refund``),
with the reason shown to the caller: nothing is created that nothing could
settle."""


class RailError(Exception):
    """A rail adapter could not be built or called as configured (missing base
    URL or credentials). Never raised for a rail's own answers: those are
    ``RailStatus`` / ``Submit`` values."""


class RailPaused(Exception):
    """The rail asked for less traffic (HTTP 429 or 503 with ``Retry-After``,
    design/rails.md) and this process holds every call to it until
    ``seconds`` from now (``vpay.rails.gate.RailGate``). Raised by an
    adapter's ``request_to_pay``, ``status``, ``refund`` and
    ``refund_status`` before any request is sent while the pause lasts, and
    by the call whose answer asked for it. Not a rail answer and never a
    decline: the caller reschedules the work to the end of the pause
    (``vpay.handlers.registry.handle``), without counting it as a failure or
    a rung. ``reason`` is short and credential-free."""

    def __init__(self, rail: str, seconds: float, reason: str, http_status: int | None = None):
        super().__init__(f"rail {rail} paused for {seconds:.1f} s: {reason}")
        self.rail = rail
        self.seconds = seconds
        self.reason = reason
        # The rail's answer that asked for the pause (429/503); None when
        # the gate refused the call before sending it.
        self.http_status = http_status


def seconds_setting(environ, name: str, maximum: float = 600.0) -> float | None:
    """A rail adapter's timeout setting ``name`` in seconds, or ``None`` when
    unset. Raises ``RailError`` unless it is a finite number above 0 and at
    most ``maximum`` (a 0, negative, NaN or infinite timeout would only fail,
    or hang, at the first rail call)."""
    return env_seconds(name, None, maximum=maximum, env=environ, error=RailError)


def tuning_from_env(environ, kwargs: dict, timeouts: dict[str, str], max_pause_env: str,
                    optional: dict[str, str] | None = None) -> dict:
    """Fill an adapter's constructor ``kwargs`` from its environment, the
    way every ``from_env`` does: each of ``timeouts`` (``{kwarg: VARIABLE}``,
    seconds, ``seconds_setting``'s bound), ``max_pause`` from
    ``max_pause_env`` (seconds, at most 3600), and each of ``optional``
    (``{kwarg: VARIABLE}``, taken as text when set). A kwarg the caller
    passed wins. Answers ``kwargs``; raises ``RailError`` on a bad value."""
    for key, name in timeouts.items():
        value = seconds_setting(environ, name)
        if value is not None and key not in kwargs:
            kwargs[key] = value
    pause = seconds_setting(environ, max_pause_env, maximum=3600.0)
    if pause is not None and "max_pause" not in kwargs:
        kwargs["max_pause"] = pause
    for key, name in (optional or {}).items():
        if key not in kwargs and environ.get(name):
            kwargs[key] = environ[name]
    return kwargs


class MalformedCallback(ValueError):
    """``parse_callback`` was given a body or query it cannot read. The route
    answers 400 and writes nothing."""


@dataclass(frozen=True)
class ChargeRequest:
    """What a rail needs to ask a payer to pay, or to ask how that went.

    ``charge_id`` is ours (``ch_…``); ``rail_reference`` is the UUIDv4 we
    chose and send as MoMo's ``X-Reference-Id`` (it becomes the rail's resource
    id). ``amount`` is in minor units; ``payer`` is an MSISDN (digits only,
    international form, no ``+``).
    """

    charge_id: str
    rail_reference: str
    amount: int
    currency: str
    payer: str
    description: str = ""
    # What the rail handed back at submission and we stored (charges.rail_data),
    # e.g. Orange's pay_token or M-Pesa's CheckoutRequestID (a reference the
    # RAIL assigns: the key of its status read), needed by its status query. Never a secret such
    # as Orange's notif_token (only its hash is stored). Empty for MTN.
    rail_data: Mapping[str, str] = field(default_factory=dict)
    # True when this request-to-pay may have been sent before (the resubmit
    # job): an adapter must not read "already have it" answers (Orange's 403
    # to a reused order_id) as a refusal of our configuration.
    resend: bool = False


class SubmitKind(enum.Enum):
    ACCEPTED = "accepted"          # the rail holds the request (MoMo 202, or 409 on a resend)
    REJECTED = "rejected"          # the rail refused it for good (payer not found, bad request, ...)
    MISCONFIGURED = "misconfigured"  # refused because OUR configuration is wrong (see below)
    NO_ANSWER = "no_answer"        # timeout, connection refused, 5xx, a 401 before a token refresh: we do not know


@dataclass(frozen=True)
class Submit:
    """The answer to a request-to-pay. ``reason`` is the rail's code when it
    gave one (``INVALID_CURRENCY``, ``SERVICE_UNAVAILABLE``, ...)."""

    kind: SubmitKind
    reason: str | None = None
    http_status: int | None = None
    # ACCEPTED only: what the rail handed back and the caller must keep, e.g.
    # Orange's pay_token, payment_url and notif_token (vpay.money.payments.submit
    # stores the first two and only the SHA-256 of notif_token). Empty for MTN.
    rail_data: Mapping[str, str] = field(default_factory=dict)
    # NO_ANSWER only: True when the adapter KNOWS the request never left this
    # process (the token fetch failed, the connection was never made), so the
    # rail cannot have acted on it. False means "it may have arrived": for a
    # rail that is not ``resend_safe`` that request is never sent again
    # (docs/flows/mpesa.md, "A lost answer"). Conservative default.
    unsent: bool = False


class StatusKind(enum.Enum):
    PENDING = "pending"            # the payer has not decided (MoMo PENDING, or FAILED/ONGOING, FAILED/PAYER_DELAYED)
    SUCCEEDED = "succeeded"        # money moved (MoMo SUCCESSFUL)
    FAILED = "failed"              # the payment ended without money moving; ``reason`` says why
    NOT_FOUND = "not_found"        # the rail does not know the reference (MoMo 404 RESOURCE_NOT_FOUND)
    MISCONFIGURED = "misconfigured"  # the READ was refused for our configuration: says nothing about the payment
    NO_ANSWER = "no_answer"        # 5xx, timeout, connection refused, malformed body: never a decline


# Misconfiguration (design/rails.md, "Rail errors that mean *our*
# configuration is wrong"): an answer that blames our credentials, callback
# host, target environment, currency setup or subscription, never the payer.
# ``SubmitKind.MISCONFIGURED``: the request was refused before it reached a
# payer. ``StatusKind.MISCONFIGURED``: a status read was refused; the payment
# may be anywhere. ``RailStatus.configuration``: the rail says the
# transaction itself FAILED for such a reason (MoMo FAILED with
# INVALID_CURRENCY, ...). The adapters decide which codes mean this; what a
# caller does with it is docs/flows/reconciler.md, "Configuration is not a decline".


TERMINAL = frozenset({StatusKind.SUCCEEDED, StatusKind.FAILED})


@dataclass(frozen=True)
class RailStatus:
    """The answer to an authenticated status query.

    ``reason`` is the rail's reason code (a plain string: MoMo's ``reason``
    normalised from either its string or its ``{code, message}`` shape).
    ``amount`` (minor units) and ``currency`` are what the rail reports for
    the transaction, or ``None`` when its answer does not say.
    ``financial_transaction_id`` is the rail's id for a moved payment, when
    given. ``detail`` is a short human text for logs (never a credential).

    Unreadable is not unreported: ``unreadable`` names every field the rail's
    answer carried but the adapter could not read by the rail's documented
    shape (``"amount"``, ``"currency"``, ``"reason"``,
    ``"financial_transaction_id"``); those fields are ``None`` here, and a
    terminal answer with any of them settles nothing (``disagreement``). A
    field the answer did not carry at all is ``None`` and not listed.
    ``configuration`` is True when a FAILED answer's reason blames our
    configuration, not the payer (see the note above ``RailStatus``).
    """

    kind: StatusKind
    reason: str | None = None
    financial_transaction_id: str | None = None
    http_status: int | None = None
    detail: str | None = None
    # What the rail says moved, when its answer says (MoMo's status body
    # echoes amount and currency): minor units and ISO 4217. The poll handler
    # refuses to settle a success whose amount or currency is not the charge's.
    amount: int | None = None
    currency: str | None = None
    unreadable: tuple[str, ...] = ()
    configuration: bool = False

    @property
    def terminal(self) -> bool:
        """The rail reported a terminal status (whether or not it may settle:
        see ``disagreement``)."""
        return self.kind in TERMINAL

    def disagreement(self, amount: int, currency: str) -> str | None:
        """Why this terminal answer must NOT settle a charge (or refund) of
        ``amount`` minor units in ``currency``, or ``None`` when it may.

        ``"unreadable"``: a field was present but unreadable (``unreadable``);
        ``"other_currency"`` / ``"other_amount"``: the rail reported another
        currency or amount than ours. A field the rail did not report is not a
        disagreement. Always ``None`` for a non-terminal answer. The poll
        handlers raise one ``rail_contradiction`` alert for a disagreement and
        keep polling (design page, "What can go wrong")."""
        if not self.terminal:
            return None
        if self.unreadable:
            return "unreadable"
        if self.currency is not None and self.currency != currency.upper():
            return "other_currency"
        if self.amount is not None and self.amount != amount:
            return "other_amount"
        return None


@dataclass(frozen=True)
class CallbackIds:
    """Identifiers extracted from a rail callback, and nothing else: no
    status, no amount. ``rail_reference`` is the reference we put in the
    callback URL we gave the rail; ``hints`` holds other identifiers the body
    carried (e.g. ``externalId``, Orange's ``notif_token``), for logs only."""

    rail_reference: str
    hints: Mapping[str, str] = field(default_factory=dict)
    # Identifiers the RAIL assigned that its status read needs, under their
    # ``charges.rail_data`` keys (M-Pesa: ``checkout_request_id``), for a
    # charge whose submission answer was lost. Never a status: stored only by
    # ``vpay.money.charges.adopt_status_keys`` (a charge whose request may
    # have left, that has none yet, and no other charge holds them); a wrong
    # one makes the status read answer NOT_FOUND, which settles nothing.
    status_keys: Mapping[str, str] = field(default_factory=dict)


class Rail(Protocol):
    """One mobile-money rail. Adapters live one per file in ``vpay/rails/``.

    Implementations must never raise for a rail's answer (timeouts, 5xx and
    malformed bodies are ``NO_ANSWER``; answers that blame our configuration
    are ``MISCONFIGURED``; fields present but unreadable are listed in
    ``RailStatus.unreadable``, never dropped), must bound the time one call can
    take (explicit connect/read timeouts, bounded transport retries), and must
    never put a credential in a log line or an exception text.
    """

    code: str  # "mtn", "orange", ...: the {code} of /provider/{code}/callback and charges.rail
    # False for a rail that cannot give money back (Orange Money Web Payment):
    # a refund of its charge is refused before anything is written. (M-Pesa's
    # refusal is REFUNDS_REFUSED: by the charge's rail, even unconfigured.)
    refunds_supported: bool = True
    # Whether a request-to-pay whose answer was lost may be sent again
    # automatically (``resend_safe``, below): True when the rail dedupes on a
    # key of ours (MoMo's X-Reference-Id, Orange's order_id, pawaPay's
    # depositId), so a resend is "already have it" at worst. False (M-Pesa:
    # STK Push has no key of ours) means a second send is a second prompt,
    # and a payer who approves both pays twice: such a request is sent at most
    # once (``vpay.money.payments.submit``), and a charge whose answer was
    # lost waits for an identifier (a callback's ``status_keys``), the 24-hour
    # escalation and the statement.
    resend_safe: bool = True

    # Optional (``creation_problem`` below reads it with getattr):
    # ``payment_problem(amount, currency, payer) -> (param, message) | None``,
    # what this rail can never carry (M-Pesa: not KES, not whole shillings;
    # pawaPay: a country or currency not configured), so that the payment is
    # refused at creation, before anything is written.

    def request_to_pay(self, charge: ChargeRequest) -> Submit:
        """Ask the payer to pay. Safe to repeat with the same
        ``rail_reference`` when ``resend_safe``; otherwise sent at most once
        per charge by ``vpay.money.payments.submit``."""
        ...

    def status(self, charge: ChargeRequest) -> RailStatus:
        """The authenticated status query: the only thing that moves money."""
        ...

    def parse_callback(self, query: Mapping[str, str], body: bytes) -> CallbackIds:
        """Identifiers only. Raises ``MalformedCallback`` on an unreadable input."""
        ...

    def refund(self, refund: "RefundRequest") -> Submit:
        """Give back all or part of a collected payment. Safe to repeat with
        the same ``refund.rail_reference`` (a resend is ACCEPTED). ``REJECTED``
        only when the rail refused it for good; ``MISCONFIGURED`` when it
        refused our configuration; 5xx, timeouts and a 401 before a token
        refresh are ``NO_ANSWER``."""
        ...

    def refund_status(self, refund: "RefundRequest") -> RailStatus:
        """The authenticated refund status query: the only thing that settles
        a refund. Same kinds and rules as ``status``: 5xx, timeouts and
        unreadable bodies are ``NO_ANSWER``, never a decline; ``NOT_FOUND``
        when the rail does not know ``refund.rail_reference``."""
        ...


@dataclass(frozen=True)
class RefundRequest:
    """What a rail needs to refund a collected payment, or to ask how the
    refund went.

    ``refund_id`` is ours (``re_…``); ``rail_reference`` is the refund's own
    UUIDv4 (MoMo's ``X-Reference-Id`` of the refund); ``charge_rail_reference``
    is the refunded charge's reference (MoMo's ``referenceIdToRefund``).
    ``amount`` is in minor units; ``payer`` is the charge's payer MSISDN (who
    gets the money back; digits only, no ``+``).
    """

    refund_id: str
    rail_reference: str
    charge_rail_reference: str
    amount: int
    currency: str
    payer: str


def http_url_problem(value: str) -> str | None:
    """Why ``value`` cannot be a rail's base URL or one of our callback URLs,
    or ``None`` when it can: it must be ``http://`` or ``https://`` with a
    host and a valid port, and hold no whitespace or control character
    anywhere (``requests`` would otherwise send to a mangled URL, or one
    with a pasted line break, on every call instead of refusing at boot)."""
    from urllib.parse import urlsplit
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        return "contains whitespace or a control character"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "has no host"
    return None


_CURRENCY_CODE = re.compile(r"[A-Za-z]{3}")


def reported_currency(body: dict, unreadable: list[str]) -> str | None:
    """The ISO 4217 code a rail's status body reports, upper-cased; None when
    the body has no ``currency``. A ``currency`` that is present but not three
    letters is appended to ``unreadable`` (issue 12: unreadable is never
    "not reported") and answers None."""
    if "currency" not in body:
        return None
    raw = body["currency"]
    if isinstance(raw, str) and _CURRENCY_CODE.fullmatch(raw):
        return raw.upper()
    unreadable.append("currency")
    return None


def resend_safe(rail: "Rail | None") -> bool:
    """``rail.resend_safe`` (default True, for adapters and doubles that do
    not say): whether a request-to-pay that may have reached the rail can be
    sent again without risking a second payment (the ``Rail`` attribute)."""
    return bool(getattr(rail, "resend_safe", True))


def creation_problem(rail: "Rail | None", amount: int, currency: str, payer: str) -> tuple[str, str] | None:
    """``(param, message)`` when ``rail`` can never carry a payment of
    ``amount`` minor units of ``currency`` from ``payer`` (an adapter's
    optional ``payment_problem``), else ``None``. The caller refuses the
    payment at creation with that clear error and writes nothing
    (``vpay.money.payments.create_and_submit``)."""
    check = getattr(rail, "payment_problem", None)
    return check(amount, currency, payer) if callable(check) else None
