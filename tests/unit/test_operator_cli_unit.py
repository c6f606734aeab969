"""The default retention. The unit half of
tests/acceptance/test_operator_cli.py.
"""

from __future__ import annotations

from vpay.base.settings import Settings


def test_settings_default_retention_is_ninety_days():
    assert Settings.from_env({}).retention_days == 90
    assert Settings.from_env({"VPAY_RETENTION_DAYS": "0"}).retention_days == 0
