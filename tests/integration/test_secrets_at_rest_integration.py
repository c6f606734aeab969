"""Webhook secrets sealed at rest, on a real Postgres (issue #27): what is
stored, rotation under two keys, resuming a cut-short rotation, a rotation
racing a secret rotation, plaintext rows from before 0018 sealed by
``migrate``, and the boot check against a wrong key."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from vpay.base import secretbox
from vpay.base.secretbox import SecretBox, WrongKey, new_key
from vpay.money import merchants
from vpay import webhooks
from vpay.webhooks import sealing

PLAIN = "whsec_" + "B" * 43


def _endpoints(db, n: int, merchant: str = "m1") -> list[dict]:
    merchants.create_merchant(db, merchant)
    return [webhooks.add_endpoint(db, merchant, f"http://127.0.0.1:9/hook{i}", permit_private=True)
            for i in range(n)]


def _stored(db) -> list[tuple]:
    return db.execute("SELECT id, secret, previous_secret FROM webhook_endpoints ORDER BY id").fetchall()


def _use_keys(monkeypatch, *keys: str) -> SecretBox:
    monkeypatch.setenv("VPAY_SECRET_KEYS", ",".join(keys))
    return secretbox.default()


def test_secrets_are_stored_sealed_current_and_previous(db):
    ep = _endpoints(db, 1)[0]
    rotated = webhooks.rotate_secret(db, ep["id"])
    (_, secret, previous), = _stored(db)
    assert secret.startswith("fernet:") and previous.startswith("fernet:")
    assert "whsec_" not in secret + previous
    box = secretbox.default()
    assert (box.open(secret), box.open(previous)) == (rotated["secret"], ep["secret"])


def test_rotate_reseals_every_row_under_the_newest_key_then_the_old_key_can_go(db, monkeypatch):
    old, new = new_key(), new_key()
    _use_keys(monkeypatch, old)
    eps = _endpoints(db, 5)
    webhooks.rotate_secret(db, eps[0]["id"])  # one with a previous secret too
    both = _use_keys(monkeypatch, new, old)
    counts = sealing.rotate(db, both, actor="test", page=2)
    assert counts == {"endpoints": 5, "resealed": 5, "sealed_from_plaintext": 0, "current": 0,
                      "changed_meanwhile": 0}
    only_new = SecretBox((new,))
    opened = {row[0]: only_new.open(row[1]) for row in _stored(db)}
    assert opened == {e["id"]: e["secret"] for e in eps[1:]} | {eps[0]["id"]: opened[eps[0]["id"]]}
    assert all(only_new.current(v) for row in _stored(db) for v in row[1:] if v)
    # Run again: nothing left to do.
    assert sealing.rotate(db, both, actor="test")["current"] == 5


def test_a_rotation_cut_short_is_finished_by_running_it_again(db, monkeypatch):
    old, new = new_key(), new_key()
    _use_keys(monkeypatch, old)
    _endpoints(db, 5)

    class Crashing(SecretBox):
        calls = 0

        def reseal(self, stored):
            Crashing.calls += 1
            if Crashing.calls == 4:  # in the second page
                raise RuntimeError("killed")
            return super().reseal(stored)

    with pytest.raises(RuntimeError):
        sealing.rotate(db, Crashing((new, old)), actor="test", page=2)
    box = SecretBox((new, old))
    done = sum(box.current(row[1]) for row in _stored(db))
    assert done == 2  # the first page committed, the second rolled back
    counts = sealing.rotate(db, box, actor="test", page=2)
    assert (counts["current"], counts["resealed"]) == (2, 3)
    assert all(box.current(row[1]) for row in _stored(db))


def test_a_secret_rotated_during_the_rotation_is_left_as_the_merchant_rotation_wrote_it(db, db_url, monkeypatch):
    import psycopg
    old, new = new_key(), new_key()
    _use_keys(monkeypatch, old)
    ep = _endpoints(db, 1)[0]
    _use_keys(monkeypatch, new, old)
    fresh = {}

    class Racing(SecretBox):
        def reseal(self, stored):
            if not fresh:
                with psycopg.connect(db_url, autocommit=True) as other:
                    fresh.update(webhooks.rotate_secret(other, ep["id"]))
            return super().reseal(stored)

    counts = sealing.rotate(db, Racing((new, old)), actor="test")
    assert counts["changed_meanwhile"] == 1
    (_, secret, previous), = _stored(db)
    box = SecretBox((new, old))
    assert box.open(secret) == fresh["secret"] and box.open(previous) == ep["secret"]


def test_plaintext_rows_from_before_0018_are_sealed_by_migrate(db, db_url, monkeypatch):
    merchants.create_merchant(db, "m1")
    db.execute("INSERT INTO webhook_endpoints (id, merchant_id, url, secret, previous_secret, "
               "previous_secret_expires_at) VALUES ('we_old', 'm1', 'https://example.com/h', %s, %s, "
               "now() + interval '1 hour')", (PLAIN, PLAIN.replace("B", "C")))
    assert sealing.plaintext_count(db) == 1
    from vpay.cli import main
    monkeypatch.setenv("VPAY_DATABASE_URL", db_url)
    monkeypatch.delenv("VPAY_SECRET_KEYS")
    without = CliRunner().invoke(main, ["migrate", "--json"])
    assert without.exit_code == 0 and '"plaintext_secrets": 1' in without.output
    assert sealing.plaintext_count(db) == 1  # no key: left as it was, and said so
    box = _use_keys(monkeypatch, new_key())
    result = CliRunner().invoke(main, ["migrate", "--json"])
    assert result.exit_code == 0, result.output
    assert '"sealed_secrets": 1' in result.output
    assert sealing.plaintext_count(db) == 0
    (_, secret, previous), = _stored(db)
    assert (box.open(secret), box.open(previous)) == (PLAIN, PLAIN.replace("B", "C"))


def test_the_boot_check_refuses_keys_that_open_nothing_stored(db, monkeypatch):
    sealing.check_keys(db, secretbox.default())  # nothing stored: nothing to refuse
    _endpoints(db, 1)
    sealing.check_keys(db, secretbox.default())
    with pytest.raises(WrongKey):
        sealing.check_keys(db, SecretBox((new_key(),)))


def test_one_row_sealed_under_a_dropped_key_is_named_not_a_refusal_to_boot(db):
    good = _endpoints(db, 2)
    stray = SecretBox((new_key(),)).seal("whsec_stray")
    db.execute("UPDATE webhook_endpoints SET secret = %s, created_at = now() + interval '1 minute' "
               "WHERE id = %s", (stray, good[0]["id"]))  # the newest row: the old check read only it
    assert sealing.check_keys(db, secretbox.default()) == [good[0]["id"]]
    db.execute("UPDATE webhook_endpoints SET secret = %s WHERE id = %s", (stray, good[1]["id"]))
    with pytest.raises(WrongKey):  # none of the rows opens: the keys are wrong, refused
        sealing.check_keys(db, secretbox.default())
