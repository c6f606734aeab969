"""Settings read from the environment (12-factor; CLI flags override).
Names are the contract's "Configuration" table."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Mapping

from vpay.base.db import ConfigError


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")
    return value


def env_seconds(name: str, default: float | None, *, maximum: float, minimum: float = 0.0,
                env: Mapping[str, str] | None = None,
                error: type[Exception] = ConfigError) -> float | None:
    """The setting ``name`` (``env``, default ``os.environ``) as seconds, or
    ``default`` when it is unset or blank. Raises ``error`` (``ConfigError``
    by default: the commands exit 78) unless it is a finite number above
    ``minimum`` and at most ``maximum``: a 0, negative, NaN or infinite
    timeout would only fail, or hang, at the first call that uses it. The
    message names the variable, the bounds and what was given. The one
    parser for every ``*_SECONDS`` setting (API, rail adapters, webhooks)."""
    env = os.environ if env is None else env
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and minimum < value <= maximum):
        raise error(f"{name} must be a number of seconds above {minimum:g} and at most {maximum:g}, "
                    f"got {raw!r}")
    return value


API_RAIL_TIMEOUT_SECONDS = 3.0
"""Default of ``VPAY_API_RAIL_TIMEOUT_SECONDS``: the longest an API request
waits on a rail (one request-to-pay, token fetch included)."""


RETENTION_DAYS = 90
"""Default of ``VPAY_RETENTION_DAYS``: what the hourly sweep keeps of finished
rows (delivered events, finished webhook deliveries, acknowledged alerts,
dead letters). 90 days covers a rail's monthly statement and its disputes."""
MAX_RETENTION_DAYS = 36500


def _retention_days(env: Mapping[str, str]) -> int:
    raw = env.get("VPAY_RETENTION_DAYS", "").strip()
    if not raw:
        return RETENTION_DAYS
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"VPAY_RETENTION_DAYS must be a whole number of days (0 keeps everything), "
                          f"got {raw!r}") from None
    if not 0 <= value <= MAX_RETENTION_DAYS:
        raise ConfigError(f"VPAY_RETENTION_DAYS must be 0..{MAX_RETENTION_DAYS} (0 keeps everything), "
                          f"got {value}")
    return value


@dataclass(frozen=True)
class Settings:
    """``prompt_ttl_seconds``: how long a payer's prompt lives (design page,
    "The prompt-expiry half"; default 900). ``escalate_after_seconds``: the
    24-hour horizon from ``charges.created_at`` ("Timers assert nothing").
    ``retention_days``: ``VPAY_RETENTION_DAYS`` (default 90; 0 keeps
    everything), what the hourly sweep prunes (``vpay.money.operator.prune``).
    ``api_rail_timeout_seconds``: the total deadline of a rail call made by
    ``vpay-server api`` (``VPAY_API_RAIL_TIMEOUT_SECONDS``, default 3, at
    most 60); past it the create answers the intent ``processing`` and the
    worker's resubmit finishes the submission (docs/api.md)."""

    prompt_ttl_seconds: int = 900
    escalate_after_seconds: int = 24 * 3600
    retention_days: int = RETENTION_DAYS
    api_rail_timeout_seconds: float = API_RAIL_TIMEOUT_SECONDS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Raises ``ConfigError`` (exit 78) for a value that cannot be meant."""
        env = os.environ if environ is None else environ
        return cls(prompt_ttl_seconds=_positive_int(env, "VPAY_PROMPT_TTL_SECONDS", 900),
                   retention_days=_retention_days(env),
                   api_rail_timeout_seconds=env_seconds("VPAY_API_RAIL_TIMEOUT_SECONDS",
                                                     API_RAIL_TIMEOUT_SECONDS, maximum=60.0,
                                                     env=env))
