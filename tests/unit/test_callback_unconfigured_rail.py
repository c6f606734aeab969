"""A callback for a rail that is not configured: 404, and one warning per
rail per process however many unauthenticated requests arrive (docs/api.md)."""

from __future__ import annotations

import logging

import falcon.testing
import pytest

from vpay.api.callbacks import CallbackResource
from vpay.api.errors import ApiError
from vpay.rails.port import RailError


def _unconfigured(code: str):
    raise RailError(f"rail {code} is not configured")


def test_an_unconfigured_rails_callbacks_are_404_and_warned_once_per_rail(caplog):
    resource = CallbackResource(db=None, rails=_unconfigured)  # never reaches the database
    caplog.set_level(logging.DEBUG)
    for code in ("orange", "mtn", "orange", "orange", "mtn"):
        req = falcon.testing.create_req(method="POST", path=f"/provider/{code}/callback", body=b"{}")
        with pytest.raises(ApiError) as caught:
            resource.on_post(req, falcon.Response(), code)
        assert caught.value.status == 404
    said = [(r.levelno, r.rail) for r in caplog.records if "not configured" in r.getMessage()]
    assert said == [(logging.WARNING, "orange"), (logging.WARNING, "mtn")]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
