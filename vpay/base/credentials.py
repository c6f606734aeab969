"""Secrets from systemd credentials as well as the environment.

A secret setting (a rail credential, ``VPAY_SECRET_KEYS``,
``VPAY_API_METRICS_TOKEN``) is read from the environment or, under a unit
with ``LoadCredential=NAME:/etc/vpay/credentials/NAME`` (or
``LoadCredentialEncrypted=``), from the file ``$CREDENTIALS_DIRECTORY/NAME``:
the file's name is the variable's name (systemd.exec(5), "Credentials").
A credential is visible to the service's own processes only, never in
``systemctl show`` or another unit's environment (docs/deployment.md,
"Credentials").

The same name in both places with different values is refused
(``ConfigError``, exit 78): which one wins would be a guess. One trailing
newline of a credential file is not part of the value (editors add one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Mapping

from vpay.base.db import ConfigError

DIRECTORY_ENV = "CREDENTIALS_DIRECTORY"


def _read(directory: str | None, name: str) -> str | None:
    if not directory or not name or "/" in name or name.startswith("."):
        return None
    path = Path(directory) / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"credential {name} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if text.endswith("\n"):
        text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
    return text


def lookup(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of ``name``: the environment's (``env``, default
    ``os.environ``) or the credential file's under ``$CREDENTIALS_DIRECTORY``
    (taken from ``env``); None when neither is set. Raises ``ConfigError``
    when both are set and differ, or the file cannot be read."""
    env = os.environ if env is None else env
    given = env.get(name)
    stored = _read(env.get(DIRECTORY_ENV), name)
    if given and stored is not None and given != stored:
        raise ConfigError(f"{name} is set both in the environment and as a credential "
                          f"(${DIRECTORY_ENV}/{name}), with different values: keep one")
    return given if given else stored


class WithCredentials(Mapping[str, str]):
    """``env`` (default ``os.environ``) with the credentials under
    ``$CREDENTIALS_DIRECTORY`` filled in: ``mapping[name]`` is
    ``lookup(name, env)``. Hand it to code that reads settings from a
    mapping (the rail adapters' ``from_env``).

    A consistent ``Mapping``: its names (``iter``, ``len``, ``items``) are
    exactly those ``mapping[name]`` answers for, the variables set to a
    non-empty value and the credential files of a usable name. A variable
    set to ``""`` is unset here, as ``lookup`` reads it (issue: ``X= vpay-worker``
    crashed the boot with a ``KeyError`` when ``items()`` met it). Reading
    a name may still raise ``ConfigError`` (``lookup``'s refusals)."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self.env = os.environ if env is None else env

    def __getitem__(self, name: str) -> str:
        value = lookup(name, self.env)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        names = {name for name, value in self.env.items() if value}
        directory = self.env.get(DIRECTORY_ENV)
        if directory:
            try:
                # the names _read would read: never a dotfile
                names |= {p.name for p in Path(directory).iterdir()
                          if p.is_file() and not p.name.startswith(".")}
            except OSError:
                pass
        return iter(sorted(names))

    def __len__(self) -> int:
        return sum(1 for _ in self)
