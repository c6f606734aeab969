"""Settings read from the environment (12-factor; CLI flags override).
Names are the contract's "Configuration" table."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .db import ConfigError


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


@dataclass(frozen=True)
class Settings:
    """``prompt_ttl_seconds``: how long a payer's prompt lives (design page,
    "The prompt-expiry half"; default 900). ``escalate_after_seconds``: the
    24-hour horizon from ``charges.created_at`` ("Timers assert nothing")."""

    prompt_ttl_seconds: int = 900
    escalate_after_seconds: int = 24 * 3600

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        return cls(prompt_ttl_seconds=_positive_int(env, "VPAY_PROMPT_TTL_SECONDS", 900))
