"""Secrets at rest: values vpay must read back (a webhook endpoint's signing
secrets) are stored sealed with Fernet under the operator's keys
(``cryptography``'s ``MultiFernet``), so a database dump, a backup or a read
replica holds no usable secret (docs/security.md, "A database reader").

Keys: ``VPAY_SECRET_KEYS``, Fernet keys (``new_key()``, ``vpay-server secrets
new-key``) separated by commas, newest first; or ``VPAY_SECRET_KEYS_FILE``, a
file holding them (commas or one per line); either may also be a systemd
credential of that name (``vpay.base.credentials``). The first key seals,
every key opens: to rotate, put a new key first, run ``vpay-server secrets
rotate`` (every row re-sealed under it), then drop the old key.

A sealed value is ``fernet:`` + the token. A stored value without that
prefix is plaintext written before sealing existed (``is_sealed`` False):
``open`` passes it through, and ``vpay-server migrate`` or ``secrets rotate``
seal it (sql/0018_secrets_at_rest.sql).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from vpay.base.db import ConfigError

KEYS_ENV = "VPAY_SECRET_KEYS"
KEYS_FILE_ENV = "VPAY_SECRET_KEYS_FILE"
PREFIX = "fernet:"


class WrongKey(ConfigError):
    """No configured key opens a stored value (a wrong key, or the old key
    dropped before ``secrets rotate`` finished). A configuration problem:
    the commands exit 78 with its one line."""


def new_key() -> str:
    """A fresh Fernet key (32 random bytes, URL-safe base64, 44 characters)."""
    from cryptography.fernet import Fernet
    return Fernet.generate_key().decode("ascii")


def is_sealed(stored: str | None) -> bool:
    """Whether a stored value is sealed (else plaintext from before sealing)."""
    return bool(stored) and stored.startswith(PREFIX)


def _split(text: str) -> list[str]:
    return [part.strip() for line in text.splitlines() for part in line.split(",") if part.strip()]


def _keys_text(env: Mapping[str, str]) -> tuple[str, str] | None:
    from vpay.base.credentials import lookup
    inline = lookup(KEYS_ENV, env)
    path = lookup(KEYS_FILE_ENV, env)
    if inline and path:
        raise ConfigError(f"set {KEYS_ENV} or {KEYS_FILE_ENV}, not both")
    if inline:
        return inline, KEYS_ENV
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(), KEYS_FILE_ENV
        except OSError as exc:
            raise ConfigError(f"{KEYS_FILE_ENV} cannot be read: {exc.strerror or exc}") from None
    return None


MAX_OPENED = 256
"""How many opened secrets a ``SecretBox`` keeps (by their sealed text);
past it they are dropped and opened again."""


@dataclass(frozen=True)
class SecretBox:
    """Seals and opens stored secrets under ``keys`` (Fernet keys, newest
    first). Thread-safe (Fernet holds no state)."""

    keys: tuple[str, ...]

    def __post_init__(self) -> None:
        from cryptography.fernet import Fernet, MultiFernet
        fernets = []
        for n, key in enumerate(self.keys, 1):
            try:
                fernets.append(Fernet(key))
            except (ValueError, TypeError):
                # Never the key itself: the line goes to a journal.
                raise ConfigError(f"{KEYS_ENV}: key {n} of {len(self.keys)} is not a Fernet key "
                                  f"(44 characters of URL-safe base64; make one with "
                                  f"`vpay-server secrets new-key`)") from None
        if not fernets:
            raise ConfigError(f"{KEYS_ENV} holds no key")
        object.__setattr__(self, "_newest", fernets[0])
        object.__setattr__(self, "_all", MultiFernet(fernets))
        # what this box opened, by sealed text: every delivery attempt opens
        # its endpoint's secret (issue 30); a box is per key set, so a new
        # key set opens everything again
        object.__setattr__(self, "_opened", {})

    def seal(self, plaintext: str) -> str:
        """``plaintext`` sealed under the newest key: ``fernet:<token>``."""
        return PREFIX + self._newest.encrypt(plaintext.encode("utf-8")).decode("ascii")

    def open(self, stored: str) -> str:
        """The plaintext of a stored value: a sealed one opened with any key,
        a plaintext one (not yet sealed) as it is. Raises ``WrongKey``."""
        if not is_sealed(stored):
            return stored
        opened = self._opened.get(stored)
        if opened is not None:
            return opened
        from cryptography.fernet import InvalidToken
        try:
            opened = self._all.decrypt(stored[len(PREFIX):].encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError):
            raise WrongKey(f"{KEYS_ENV} cannot open a stored secret: none of its {len(self.keys)} "
                           f"key(s) sealed it (a wrong key, or an old key dropped before "
                           f"`vpay-server secrets rotate` finished)") from None
        if len(self._opened) >= MAX_OPENED:
            self._opened.clear()
        self._opened[stored] = opened
        return opened

    def current(self, stored: str) -> bool:
        """Whether ``stored`` is sealed under the newest key (nothing to rotate)."""
        if not is_sealed(stored):
            return False
        from cryptography.fernet import InvalidToken
        try:
            self._newest.decrypt(stored[len(PREFIX):].encode("ascii"))
            return True
        except InvalidToken:
            return False

    def reseal(self, stored: str) -> str:
        """``stored`` (sealed under any key, or plaintext) sealed under the
        newest key. Raises ``WrongKey``."""
        return self.seal(self.open(stored))


def load(env: Mapping[str, str] | None = None) -> SecretBox:
    """The box from ``VPAY_SECRET_KEYS`` or ``VPAY_SECRET_KEYS_FILE`` (or
    their credentials). Raises ``ConfigError`` (exit 78) naming what is
    missing or malformed, never a key."""
    env = os.environ if env is None else env
    found = _keys_text(env)
    if found is None:
        raise ConfigError(f"{KEYS_ENV} is not set (nor {KEYS_FILE_ENV}, nor a credential of "
                          f"either name): webhook secrets are stored sealed under it; make a key "
                          f"with `vpay-server secrets new-key` (docs/security.md)")
    text, source = found
    keys = tuple(_split(text))
    if not keys:
        raise ConfigError(f"{source} holds no key")
    return SecretBox(keys)


_cache: dict[tuple, SecretBox] = {}


def default() -> SecretBox:
    """``load()`` from this process's environment, built once per distinct
    setting (a test that changes the variable gets a new box)."""
    from vpay.base.credentials import DIRECTORY_ENV
    marker = (os.environ.get(KEYS_ENV), os.environ.get(KEYS_FILE_ENV), os.environ.get(DIRECTORY_ENV))
    box = _cache.get(marker)
    if box is None:
        box = _cache[marker] = load()
    return box
