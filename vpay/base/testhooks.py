"""Kill points for crash tests.

``pause("after_settle_commit")`` does nothing unless the process was started
with ``VPAY_TEST_PAUSE_AT`` naming that point; then it logs ``test pause``
with the point's name and blocks the calling thread for ever, so a test can
SIGKILL the real process exactly there (issue: crash safety). The names are
listed in the crash-safety table, docs/flows/crash-safety.md.
"""

from __future__ import annotations

import logging
import os
import threading

_POINT = os.environ.get("VPAY_TEST_PAUSE_AT", "")
log = logging.getLogger("vpay.testhooks")


def pause(point: str) -> None:
    if not _POINT or point != _POINT:
        return
    log.warning("test pause", extra={"point": point})
    for handler in logging.getLogger().handlers:
        handler.flush()
    threading.Event().wait()
