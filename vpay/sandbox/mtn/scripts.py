"""The MoMo sandbox's scripted payers: what a script may say and how its
options are checked.

Scripting is per payer MSISDN, through ``SandboxRail.script(payer, **opts)``
or ``PUT /_sandbox/payers/{msisdn}`` with the same options as a JSON object.
A script replaces the payer's previous one (no options = back to the
default) and applies to every transaction of that payer created after it is
set:

* ``pending_reads: int`` - answer PENDING to the first N (non-error) status
  reads of the transaction, then the outcome. When ``pending_reads`` or
  ``outcome`` is given, the read count replaces the success timer.
* ``outcome: "SUCCESSFUL"|"FAILED"|"PENDING"`` - the final status (PENDING =
  never terminal); default: the payer's default outcome.
* ``reason: str`` - the FAILED reason (needs ``outcome="FAILED"``); default:
  the payer's sandbox reason, else ``APPROVAL_REJECTED``.
* ``status_errors: list[int]`` - the first status reads answer these HTTP
  codes in order (e.g. ``[500, 503]``), MoMo-shaped bodies, before normal
  behaviour. Error reads do not count towards ``pending_reads``.
* ``rtp_errors: list[int]`` - the payer's next request-to-pay calls answer
  these codes in order WITHOUT recording the transaction (the rail did not
  take it; a later status read is 404).
* ``rtp_record_then_error: list[int]`` - after ``rtp_errors`` are used up, the
  next request-to-pay calls record the transaction but answer these codes
  (the rail took it and we did not hear; a resend gets 409).
* ``status_delay_seconds: float`` / ``rtp_delay_seconds: float`` - sleep this
  long before answering every status read / request-to-pay (to exceed a
  client's read timeout). A request-to-pay is recorded (or not) before the
  sleep, as a real rail would.
* ``callback: bool`` (default True) - send the callback.
* ``active: bool`` - what the account-holder check answers for this payer
  (default: true, false for 46733123455).
* Refunds of this payer's collections, created after the script is set:
  ``refund_pending_reads: int``, ``refund_outcome``, ``refund_reason``,
  ``refund_status_errors: list[int]``, ``refund_status_delay_seconds`` work
  as their request-to-pay twins above; ``refund_errors: list[int]`` and
  ``refund_record_then_error: list[int]`` as ``rtp_errors`` and
  ``rtp_record_then_error`` for the refund call. A refund whose collection
  is unknown or not SUCCESSFUL fails whatever the script says.

The names follow one rule the transaction kinds (``kinds.py``) rely on: a
kind's status options carry its ``status_prefix`` ("" or "refund_"), its
call options its ``call_prefix`` ("rtp_" or "refund_")."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from vpay.sandbox.mtn.codes import FAILED, STATUSES

MAX_DELAY = 600.0

SCRIPT_KEYS = frozenset({
    "pending_reads", "outcome", "reason", "status_errors", "rtp_errors",
    "rtp_record_then_error", "status_delay_seconds", "rtp_delay_seconds", "callback", "active",
    "refund_pending_reads", "refund_outcome", "refund_reason", "refund_status_errors",
    "refund_errors", "refund_record_then_error", "refund_status_delay_seconds",
})


@dataclass
class _Script:
    """One payer's script (the options above; None = not scripted)."""

    pending_reads: int | None = None
    outcome: str | None = None
    reason: str | None = None
    status_errors: list[int] = field(default_factory=list)
    rtp_errors: list[int] = field(default_factory=list)
    rtp_record_then_error: list[int] = field(default_factory=list)
    status_delay_seconds: float = 0.0
    rtp_delay_seconds: float = 0.0
    callback: bool = True
    active: bool | None = None
    refund_pending_reads: int | None = None
    refund_outcome: str | None = None
    refund_reason: str | None = None
    refund_status_errors: list[int] = field(default_factory=list)
    refund_errors: list[int] = field(default_factory=list)
    refund_record_then_error: list[int] = field(default_factory=list)
    refund_status_delay_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every option, lists copied (what the control API shows)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, list) else value
        return out


def _check_codes(name: str, value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of HTTP status codes")
    out = []
    for c in value:
        if isinstance(c, bool) or not isinstance(c, int) or not 400 <= c <= 599:
            raise ValueError(f"{name}: {c!r} is not an HTTP error code (400-599)")
        out.append(c)
    return out


def _check_delay(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_DELAY:
        raise ValueError(f"{name} must be a number of seconds between 0 and {MAX_DELAY:g}")
    return float(value)


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def _parse_outcome(opts: Mapping[str, Any], s: _Script, prefix: str) -> None:
    """``pending_reads``, ``outcome`` and ``reason`` under ``prefix`` ("" for
    collections, "refund_" for refunds) into ``s``."""
    pending, outcome, reason = f"{prefix}pending_reads", f"{prefix}outcome", f"{prefix}reason"
    if opts.get(pending) is not None:
        pr = opts[pending]
        if isinstance(pr, bool) or not isinstance(pr, int) or pr < 0:
            raise ValueError(f"{pending} must be a non-negative integer")
        setattr(s, pending, pr)
    if opts.get(outcome) is not None:
        if opts[outcome] not in STATUSES:
            raise ValueError(f"{outcome} must be one of {', '.join(STATUSES)}")
        setattr(s, outcome, opts[outcome])
    if opts.get(reason) is not None:
        if not isinstance(opts[reason], str) or not opts[reason]:
            raise ValueError(f"{reason} must be a non-empty string")
        if getattr(s, outcome) != FAILED:
            raise ValueError(f"{reason} needs {outcome}='FAILED'")
        setattr(s, reason, opts[reason])


def _parse_script(opts: Mapping[str, Any]) -> _Script:
    """A script from its options; ValueError naming the first bad one."""
    unknown = set(opts) - SCRIPT_KEYS
    if unknown:
        raise ValueError(f"unknown script option(s): {', '.join(sorted(unknown))}")
    s = _Script()
    _parse_outcome(opts, s, "")
    _parse_outcome(opts, s, "refund_")
    for name in ("status_errors", "rtp_errors", "rtp_record_then_error",
                 "refund_status_errors", "refund_errors", "refund_record_then_error"):
        if opts.get(name) is not None:
            setattr(s, name, _check_codes(name, opts[name]))
    for name in ("status_delay_seconds", "rtp_delay_seconds", "refund_status_delay_seconds"):
        if opts.get(name) is not None:
            setattr(s, name, _check_delay(name, opts[name]))
    for name in ("callback", "active"):
        if opts.get(name) is not None:
            setattr(s, name, _check_flag(name, opts[name]))
    return s


def _check_forced(status: str, reason: str | None) -> None:
    """Arguments of ``set_status`` / ``set_refund_status``: ValueError unless
    ``status`` is one of ``STATUSES`` and ``reason`` is None or a non-empty string."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    if reason is not None and (not isinstance(reason, str) or not reason):
        raise ValueError("reason must be a non-empty string")
