"""/healthz answers 503 when the database does not answer (the app in process,
no database). The unit half of tests/acceptance/test_api_intents.py.
"""

from __future__ import annotations

from falcon import testing

from vpay.api.app import create_app
from vpay.rails import build_rail


def test_healthz_is_503_when_the_database_does_not_answer():
    app = create_app("postgresql://nobody@127.0.0.1:1/x?connect_timeout=1", build_rail, db_timeout=1)
    try:
        resp = testing.TestClient(app).simulate_get("/healthz")
        assert resp.status_code == 503 and resp.json == {"status": "unavailable", "database": "unreachable"}
        resp = testing.TestClient(app).simulate_get("/v1/payment_intents/pi_x",
                                                    headers={"Authorization": "Bearer sk_x"})
        assert resp.status_code in (401, 503)  # a malformed key needs no database
    finally:
        app.vpay_db.close()
