"""Event ids are a pure function of the transition they report
(vpay.money.ids.event_id, vpay.money.charges.event_id_of), and the commit
mode's reading (vpay.base.replication.CommitMode): no database here."""

from __future__ import annotations

import pytest

from vpay.api.events import EVENT_ID
from vpay.base.replication import CommitMode
from vpay.money import charges, ids


def test_the_same_transition_always_has_the_same_id_in_the_documented_shape():
    first = ids.event_id("ch_abc", "payment_intent.succeeded")
    assert first == ids.event_id("ch_abc", "payment_intent.succeeded")
    assert EVENT_ID.match(first) and len(first) == len("evt_") + ids.ID_LENGTH


def test_an_event_id_is_pinned_across_releases():
    # A merchant dedupes on ids written by earlier releases: a transition
    # written again after a failover by a newer release must keep its id.
    # This value may never change (ids.EVENT_ID_DOMAIN).
    assert ids.event_id("ch_3kQ9x2LmP0aZ7yTq4RwV8nBc", "payment_intent.succeeded") == \
        "evt_WE3wPM1iDcEtdzc9y0eauMIc"


@pytest.mark.parametrize("other", [("ch_abd", "payment_intent.succeeded", ""),
                                   ("ch_abc", "payment_intent.payment_failed", ""),
                                   ("ch_abc", "payment_intent.succeeded", "expired"),
                                   ("re_abc", "payment_intent.succeeded", "")])
def test_any_other_subject_type_or_step_is_another_id(other):
    assert ids.event_id(*other) != ids.event_id("ch_abc", "payment_intent.succeeded")


def test_the_parts_cannot_run_into_each_other():
    # NUL-separated: ("a", "bc") and ("ab", "c") are two transitions
    assert ids.event_id("ch_a", "b.c") != ids.event_id("ch_ab", ".c")
    assert ids.event_id("ch_a", "t", "x") != ids.event_id("ch_a", "tx")


@pytest.mark.parametrize("args", [("", "payment_intent.succeeded"), ("ch_a", ""),
                                  ("ch_\0a", "payment_intent.succeeded"), ("ch_a", "t", "\0")])
def test_an_empty_part_or_a_nul_is_refused(args):
    with pytest.raises(ValueError):
        ids.event_id(*args)


def test_the_transition_of_each_event_the_state_machine_writes():
    charge = {"id": "ch_one"}
    refund = {"id": "re_one"}
    created = charges.event_id_of("payment_intent.processing", charge, {"expired": False})
    expired = charges.event_id_of("payment_intent.processing", charge, {"expired": True})
    settled = charges.event_id_of("payment_intent.succeeded", charge)
    refunded = charges.event_id_of("refund.succeeded", charge, {"refund": refund})
    assert len({created, expired, settled, refunded}) == 4  # a charge's two processing events differ
    assert created == ids.event_id("ch_one", "payment_intent.processing")
    assert expired == ids.event_id("ch_one", "payment_intent.processing", "expired")
    assert refunded == ids.event_id("re_one", "refund.succeeded")  # the refund's, not the charge's
    other_refund = charges.event_id_of("refund.succeeded", charge, {"refund": {"id": "re_two"}})
    assert other_refund != refunded  # two refunds of one charge


@pytest.mark.parametrize("names, level, synchronous", [
    ("vpay_standby", "on", True), ("ANY 1 (a, b)", "remote_apply", True), ("s", "remote_write", True),
    ("s", "local", False), ("s", "off", False), ("", "on", False), ("  ", "remote_apply", False)])
def test_commits_are_synchronous_only_with_a_named_standby_and_a_waiting_level(names, level, synchronous):
    mode = CommitMode(synchronous_standby_names=names, synchronous_commit=level)
    assert mode.synchronous is synchronous
    assert mode.fields() == {"synchronous": synchronous, "synchronous_standby_names": names,
                             "synchronous_commit": level}
