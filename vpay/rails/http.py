"""HTTP plumbing the rail adapters share (``vpay.rails.mtn``, ``vpay.rails.orange``).

One exchange with bounded transport retries inside a call's total deadline
(``vpay.base.http_deadline.Deadline``), the backpressure rule (a 429/503 with
``Retry-After`` closes the adapter's ``RailGate`` and raises ``RailPaused``),
and the internal "no answer" value both adapters turn into ``NO_ANSWER`` /
``MISCONFIGURED``. What differs per rail (which answers are retried, texts
of the details) is a parameter; the rules are design/rails.md's.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import requests
from urllib3.exceptions import NewConnectionError
from tenacity import (
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_chain,
    wait_fixed,
)
from tenacity.retry import retry_base as RetryBaseT
from tenacity.stop import stop_base

from vpay.base.http_deadline import Deadline, parse_retry_after
from vpay.rails.gate import RailGate
from vpay.rails.port import RailPaused, RailStatus, StatusKind, Submit, SubmitKind

# Transport retries inside one call: attempts, waits between them (seconds),
# and a budget after which no new attempt starts (seconds).
MAX_ATTEMPTS = 3
RETRY_WAITS = (0.2, 0.5)
RETRY_BUDGET_SECONDS = 15.0
RETRIED_HTTP_STATUSES = frozenset({502, 503, 504})
BACKPRESSURE_STATUSES = frozenset({429, 503})  # with Retry-After: the rail asks for less traffic

# Retry rule for exchanges without effect (token, status reads) or idempotent
# by a key: connection errors, timeouts, 502/503/504 (a 503 with Retry-After
# is backpressure, not retried).
RETRY_TRANSPORT_AND_5XX: RetryBaseT = (
    retry_if_exception_type((requests.ConnectionError, requests.Timeout))
    | retry_if_result(lambda r: r.status_code in RETRIED_HTTP_STATUSES
                      and "retry-after" not in r.headers)
)
# Retry rule for a request that must not be sent twice: only a connection that
# timed out before it was established (the request never left).
RETRY_UNSENT_ONLY: RetryBaseT = retry_if_exception_type(requests.ConnectTimeout)


class NoAnswer(Exception):
    """Internal to the adapters: the exchange gave nothing we can act on.
    Carries only short, credential-free texts; turned into a NO_ANSWER value
    before leaving the adapter, or MISCONFIGURED when ``misconfigured`` (the
    token endpoint refused our credentials)."""

    def __init__(self, reason: str, detail: str, http_status: int | None = None,
                 misconfigured: bool = False, unsent: bool = False):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.http_status = http_status
        self.misconfigured = misconfigured
        # The request surely never reached the rail (``Submit.unsent``).
        self.unsent = unsent

    def submit(self) -> Submit:
        kind = SubmitKind.MISCONFIGURED if self.misconfigured else SubmitKind.NO_ANSWER
        return Submit(kind, reason=self.reason, http_status=self.http_status,
                      unsent=self.unsent and kind is SubmitKind.NO_ANSWER)

    def status(self) -> RailStatus:
        kind = StatusKind.MISCONFIGURED if self.misconfigured else StatusKind.NO_ANSWER
        return RailStatus(kind, reason=self.reason, http_status=self.http_status, detail=self.detail)


class DeadlinePassed(stop_base):
    """tenacity stop condition: no new attempt once the call's deadline has passed."""

    def __init__(self, deadline: Deadline):
        self.deadline = deadline

    def __call__(self, retry_state) -> bool:
        return self.deadline.remaining() <= 0


def exchange(
    session: requests.Session,
    method: str,
    url: str,
    *,
    rail: str,
    gate: RailGate,
    deadline: Deadline,
    timeout: tuple[float, float],
    sleep: Callable[[float], None],
    retry: RetryBaseT = RETRY_TRANSPORT_AND_5XX,
    detail_suffix: str = "",
    **request_kwargs: Any,
) -> requests.Response:
    """One HTTP exchange with bounded transport retries, inside ``deadline``.

    At most ``MAX_ATTEMPTS`` attempts, ``RETRY_WAITS`` (seconds, through
    ``sleep``) between them, none after ``RETRY_BUDGET_SECONDS`` or once the
    deadline has passed; ``retry`` says which outcomes are retried. Each
    attempt has ``timeout`` = (connect, read) seconds; ``request_kwargs``
    (``headers``, ``json``, ``data``) go to ``session.request``.

    Returns the last response (possibly a 5xx), with ``sent_before`` set:
    whether an earlier attempt of this exchange may have reached the rail
    (it was answered, or failed after its connection was made). A caller
    reading the answer to a create call as a refusal of our configuration
    must not then say that no payer was asked (``refusal_after_send``).
    Raises ``NoAnswer`` when no
    response came (reason ``TIMEOUT`` when the deadline passed or the last
    attempt timed out, else ``CONNECTION_ERROR``; ``detail_suffix`` is added
    to those details), and ``RailPaused`` for ``rail`` (after closing
    ``gate`` for the wait, capped by the gate) for a 429 or 503 carrying
    ``Retry-After`` (design/rails.md, backpressure). A 3xx (a redirect, which
    the rail session never follows: docs/security.md) raises ``NoAnswer``
    with ``misconfigured`` set and reason ``HTTP_<status>``: the base URL is
    not the API's own address, our configuration, never the payer's (not
    set when an earlier attempt may have reached the rail: no answer).
    """
    retrying = Retrying(
        retry=retry,
        stop=(stop_after_attempt(MAX_ATTEMPTS) | stop_after_delay(RETRY_BUDGET_SECONDS)
              | DeadlinePassed(deadline)),
        wait=wait_chain(*(wait_fixed(w) for w in RETRY_WAITS)),
        sleep=sleep,
        # Out of attempts: hand back the last response, or re-raise the
        # last transport error, instead of tenacity's RetryError.
        retry_error_callback=lambda state: state.outcome.result(),
    )
    reached: list[bool] = []  # per attempt: whether it may have reached the rail

    def attempt() -> requests.Response:
        try:
            answer = session.request(method, url, timeout=timeout, **request_kwargs)
        except requests.RequestException as exc:
            reached.append(not never_connected(exc))
            raise
        reached.append(True)  # answered: the rail, or what fronts it, had the request
        return answer

    try:
        response = retrying(attempt)
    except requests.RequestException as exc:
        # surely unsent only if no attempt of this exchange may have got through
        unsent = never_connected(exc) and not any(reached[:-1])
        if deadline.expired:
            raise NoAnswer("TIMEOUT", f"total deadline of {deadline.seconds:g} s passed", unsent=unsent) from None
        if isinstance(exc, requests.Timeout):
            # Only the class name: exception texts can carry URLs.
            raise NoAnswer("TIMEOUT", f"timeout ({type(exc).__name__}){detail_suffix}", unsent=unsent) from None
        raise NoAnswer("CONNECTION_ERROR", f"{type(exc).__name__}{detail_suffix}", unsent=unsent) from None
    # An earlier attempt of this exchange may have reached the rail (a 504 or
    # a reset after sending, then retried): a refusal of the last attempt
    # then proves nothing about the first (a fresh-clone review, issue 30).
    response.sent_before = any(reached[:-1])
    if 300 <= response.status_code < 400:
        # The session never follows one (vpay.base.http_deadline.RailSession):
        # the configured base URL is not the API's own address (http for
        # https, a moved host). Our configuration, said at once, unless an
        # earlier attempt may have got through: then it is no answer. The
        # Location is not repeated (a text that may carry anything).
        raise NoAnswer(f"HTTP_{response.status_code}",
                       f"HTTP {response.status_code}: a redirect, never followed; the base URL is not "
                       f"the rail API's own address (http for https?)"
                       + ("; an earlier attempt may have reached the rail" if response.sent_before else ""),
                       http_status=response.status_code, misconfigured=not response.sent_before)
    if response.status_code in BACKPRESSURE_STATUSES:
        wait = parse_retry_after(response.headers.get("retry-after"), response.headers.get("date"))
        if wait is not None and wait > 0:
            left = gate.pause(wait, f"HTTP {response.status_code} Retry-After "
                                    f"{response.headers.get('retry-after', '')[:40]}")
            raise RailPaused(rail, left, f"HTTP {response.status_code} with Retry-After",
                             http_status=response.status_code)
    return response


REFUSALS = frozenset({SubmitKind.MISCONFIGURED, SubmitKind.REJECTED})
"""The create answers that end a first send (``vpay.money.payments.submit``):
never read from a retry after an attempt that may have got through."""


def refusal_after_send(submit: Submit, response: requests.Response) -> Submit:
    """``submit``, the adapter's reading of ``response`` to a create call
    (request-to-pay, refund), unless it is a refusal (``REFUSALS``: our
    configuration, or the request itself) while an earlier attempt may have
    reached the rail (``response.sent_before``; for MoMo's call that
    re-sent after a 401, the first exchange's too): that attempt may have
    asked the payer, so the refusal of the retry proves nothing about it,
    and the answer is NO_ANSWER with the same reason. The resubmit job then
    sends again as a first attempt: an idempotent rail that had the request
    answers "already have it" (ACCEPTED), one that did not answers for
    itself (``vpay.money.payments.submit``)."""
    if submit.kind in REFUSALS and getattr(response, "sent_before", False):
        return Submit(SubmitKind.NO_ANSWER, reason=submit.reason, http_status=submit.http_status)
    return submit


def not_a_refusal(no: NoAnswer) -> NoAnswer:
    """``no`` with ``misconfigured`` cleared, for a refusal met after an
    earlier attempt may have reached the rail (see ``refusal_after_send``)."""
    if not no.misconfigured:
        return no
    return NoAnswer(no.reason, f"{no.detail}; an earlier attempt may have reached the rail",
                    http_status=no.http_status)


def never_connected(exc: BaseException) -> bool:
    """Whether ``exc`` (the last attempt's ``requests`` error) proves that no
    byte of the request left: the connection timed out before it was made
    (``ConnectTimeout``) or was refused (urllib3's ``NewConnectionError``).
    A reset, a read timeout or anything else may follow a request the rail
    received: False. (Every earlier attempt of a ``RETRY_UNSENT_ONLY`` call
    was a ``ConnectTimeout``, or it would not have been retried.)"""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if isinstance(exc, requests.ConnectionError):
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        return isinstance(reason, NewConnectionError)
    return False


def json_object(content: bytes) -> dict[str, Any] | None:
    """``content`` parsed as a JSON object, or None if it is not one (not
    JSON, not UTF-8, nested too deep, or another JSON value)."""
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):  # ValueError includes JSONDecodeError and UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


def lifetime_seconds(expires_in: Any) -> float:
    """A token's ``expires_in`` (seconds, number or numeric string) as a
    float; 0 (use once, do not cache) when missing or not a positive finite
    number."""
    try:
        lifetime = float(expires_in)
    except (TypeError, ValueError):
        return 0.0
    return lifetime if math.isfinite(lifetime) and lifetime > 0 else 0.0
