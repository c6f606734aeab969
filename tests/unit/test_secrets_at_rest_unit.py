"""Secrets at rest and credentials, without a database (issue #27):
``vpay.base.secretbox`` (MultiFernet under VPAY_SECRET_KEYS),
``vpay.base.credentials`` ($CREDENTIALS_DIRECTORY), the rails reading
theirs from there, the HTTP limits' settings and the bounded metric labels."""

from __future__ import annotations

import pytest

from vpay.base import credentials, secretbox
from vpay.base.db import ConfigError
from vpay.base.secretbox import SecretBox, WrongKey, new_key

SECRET = "whsec_" + "A" * 43


def test_a_sealed_secret_holds_no_plaintext_and_opens_again():
    box = SecretBox((new_key(),))
    sealed = box.seal(SECRET)
    assert sealed.startswith("fernet:") and SECRET not in sealed and "whsec_" not in sealed
    assert box.open(sealed) == SECRET
    assert box.seal(SECRET) != sealed  # a fresh IV each time: equal secrets look different
    assert box.open(SECRET) == SECRET  # plaintext from before sealing passes through


def test_rotation_with_two_keys_the_first_seals_every_key_opens():
    old, new = new_key(), new_key()
    sealed_old = SecretBox((old,)).seal(SECRET)
    both = SecretBox((new, old))
    assert both.open(sealed_old) == SECRET and not both.current(sealed_old)
    resealed = both.reseal(sealed_old)
    assert both.current(resealed)
    assert SecretBox((new,)).open(resealed) == SECRET  # the old key can go now
    assert both.current(both.seal(SECRET))


def test_a_wrong_key_is_a_one_line_refusal_naming_no_key():
    key, other = new_key(), new_key()
    sealed = SecretBox((key,)).seal(SECRET)
    with pytest.raises(WrongKey) as caught:
        SecretBox((other,)).open(sealed)
    message = str(caught.value)
    assert "\n" not in message and "VPAY_SECRET_KEYS cannot open a stored secret" in message
    assert key not in message and other not in message
    assert isinstance(caught.value, ConfigError)  # the commands exit 78


def test_missing_or_malformed_keys_are_refused_by_name_never_by_value():
    with pytest.raises(ConfigError, match="VPAY_SECRET_KEYS is not set"):
        secretbox.load({})
    with pytest.raises(ConfigError, match="holds no key"):
        secretbox.load({"VPAY_SECRET_KEYS": " , "})
    good = new_key()
    with pytest.raises(ConfigError, match="key 2 of 2 is not a Fernet key") as caught:
        secretbox.load({"VPAY_SECRET_KEYS": f"{good},not-a-key-at-all"})
    assert "not-a-key-at-all" not in str(caught.value) and good not in str(caught.value)
    with pytest.raises(ConfigError, match="not both"):
        secretbox.load({"VPAY_SECRET_KEYS": good, "VPAY_SECRET_KEYS_FILE": "/x"})


def test_keys_from_a_file_or_a_credential(tmp_path):
    old, new = new_key(), new_key()
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{new}\n{old}\n")
    box = secretbox.load({"VPAY_SECRET_KEYS_FILE": str(keys_file)})
    assert box.keys == (new, old)
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "VPAY_SECRET_KEYS").write_text(f"{new},{old}\n")
    assert secretbox.load({"CREDENTIALS_DIRECTORY": str(creds)}).keys == (new, old)
    with pytest.raises(ConfigError, match="cannot be read"):
        secretbox.load({"VPAY_SECRET_KEYS_FILE": str(tmp_path / "absent")})


def test_a_credential_is_read_from_the_directory_and_must_agree_with_the_environment(tmp_path):
    (tmp_path / "VPAY_MTN_API_KEY").write_text("from-the-credential\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert credentials.lookup("VPAY_MTN_API_KEY", env) == "from-the-credential"  # one newline dropped
    assert credentials.lookup("VPAY_MTN_API_USER", env) is None
    assert credentials.lookup("VPAY_MTN_API_KEY", env | {"VPAY_MTN_API_KEY": "from-the-credential"}) \
        == "from-the-credential"
    with pytest.raises(ConfigError, match="both in the environment and as a credential") as caught:
        credentials.lookup("VPAY_MTN_API_KEY", env | {"VPAY_MTN_API_KEY": "other"})
    assert "other" not in str(caught.value) and "from-the-credential" not in str(caught.value)
    assert credentials.lookup("../etc/passwd", env) is None  # a name, never a path


def test_with_credentials_lists_exactly_the_names_it_answers_for(tmp_path):
    # A Mapping must agree with itself: a name iter() lists, getitem answers
    # (a blank variable listed but refused crashed every boot: `X= vpay-worker`).
    from vpay.base.credentials import WithCredentials
    (tmp_path / "VPAY_MTN_API_KEY").write_text("from-the-credential\n")
    (tmp_path / "VPAY_MTN_API_USER").write_text("")  # a credential, even empty, is set
    (tmp_path / ".hidden").write_text("x")  # never read: not a name
    (tmp_path / "a-directory").mkdir()  # not a credential: not listed
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "BLANK": "", "SET": "v",
           "VPAY_MTN_API_KEY": "", "VPAY_MTN_BASE_URL": ""}
    mapping = WithCredentials(env)
    names = list(mapping)
    assert names == ["CREDENTIALS_DIRECTORY", "SET", "VPAY_MTN_API_KEY", "VPAY_MTN_API_USER"]
    assert len(mapping) == len(names) == len(mapping.items())
    assert dict(mapping.items()) == {"CREDENTIALS_DIRECTORY": str(tmp_path), "SET": "v",
                                     "VPAY_MTN_API_KEY": "from-the-credential", "VPAY_MTN_API_USER": ""}
    for name in ("BLANK", "VPAY_MTN_BASE_URL", ".hidden"):
        assert name not in mapping and mapping.get(name) is None
        with pytest.raises(KeyError):
            mapping[name]
    # without a credentials directory: the environment's non-empty variables alone
    assert dict(WithCredentials({"X": "", "Y": "1"}).items()) == {"Y": "1"}
    assert len(WithCredentials({"X": ""})) == 0


def test_configured_rails_ignores_blank_variables():
    from vpay.base.credentials import WithCredentials
    from vpay.rails import configured_rails
    env = {"ZZZ_UNRELATED": "", "VPAY_MTN_BASE_URL": "", "VPAY_ORANGE_CLIENT_ID": ""}
    assert configured_rails(WithCredentials(env)) == []


def test_the_rails_take_their_credentials_from_the_credentials_directory(tmp_path, monkeypatch):
    from vpay.rails import build_rail, configured_rails
    for name, value in {"VPAY_MTN_SUBSCRIPTION_KEY": "sub-key", "VPAY_MTN_API_KEY": "api-key",
                        "VPAY_MTN_API_USER": "7c1e3f0a-5b2d-4e8a-9c6f-0d1b2a3c4e5f"}.items():
        (tmp_path / name).write_text(value)
    for name in list(__import__("os").environ):
        if name.startswith(("VPAY_MTN_", "VPAY_ORANGE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("VPAY_MTN_BASE_URL", "http://127.0.0.1:9")  # not a secret: stays in the environment
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    rail = build_rail("mtn")
    assert rail._collection.subscription_key == "sub-key"  # the one not in the environment
    assert configured_rails() == ["mtn"]


def test_the_http_limits_are_named_settings():
    from vpay.api.server import HttpLimits
    limits = HttpLimits.from_env({"VPAY_HTTP_HEADER_TIMEOUT_SECONDS": "5", "VPAY_HTTP_BODY_TIMEOUT_SECONDS": "7",
                                  "VPAY_HTTP_IDLE_TIMEOUT_SECONDS": "9",
                                  "VPAY_HTTP_MAX_CONNECTIONS_PER_ADDRESS": "0",
                                  "VPAY_HTTP_MAX_CONNECTIONS": "100"})
    assert (limits.header_seconds, limits.body_seconds, limits.idle_seconds, limits.per_address,
            limits.connections) == (5, 7, 9, 0, 100)
    assert HttpLimits.from_env({}) == HttpLimits()
    for name, value in (("VPAY_HTTP_HEADER_TIMEOUT_SECONDS", "0"), ("VPAY_HTTP_BODY_TIMEOUT_SECONDS", "nan"),
                        ("VPAY_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "-1"), ("VPAY_HTTP_MAX_CONNECTIONS", "x")):
        with pytest.raises(ConfigError, match=name):
            HttpLimits.from_env({name: value})


def test_request_fed_labels_map_into_fixed_sets(monkeypatch):
    from vpay.base import metrics
    monkeypatch.setattr(metrics, "_api_routes", metrics._api_routes)  # restored after
    metrics.set_api_routes(["/healthz", "/v1/payment_intents/{intent_id}"])
    assert metrics.api_labels("GET", "/healthz", 200) == ("GET", "/healthz", "200")
    assert metrics.api_labels("BREW", "/healthz", 405) == ("other", "/healthz", "405")
    assert metrics.api_labels("get", None, 404) == ("other", "(no route)", "404")
    assert metrics.api_labels("GET", "/made/{up}", 299) == ("GET", "other", "other")


def test_an_opened_secret_is_kept_per_box_bounded_and_a_box_of_other_keys_still_refuses():
    # Every delivery attempt opens its endpoint's secret: the box keeps what
    # it opened (issue 30), never across key sets, at most MAX_OPENED.
    box = SecretBox((new_key(),))
    sealed = box.seal("whsec_kept")
    assert box.open(sealed) == "whsec_kept"
    object.__setattr__(box, "_all", None)  # a second open that decrypted again would fail here
    assert box.open(sealed) == "whsec_kept"
    with pytest.raises(WrongKey):
        SecretBox((new_key(),)).open(sealed)
    other = SecretBox((new_key(),))
    for n in range(secretbox.MAX_OPENED + 10):
        other.open(other.seal(f"whsec_{n}"))
    assert len(other._opened) <= secretbox.MAX_OPENED
