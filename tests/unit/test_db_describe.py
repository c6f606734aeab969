"""The "database in use" log line names the server libpq really connects to."""

from vpay.base.db import describe


def test_what_the_url_leaves_out_comes_from_libpqs_environment_not_a_guess():
    # README's "Run it for real": PGHOST/PGUSER name the server, the URL only the database.
    env = {"PGHOST": "db.internal", "PGPORT": "6432", "PGUSER": "vpay"}
    assert describe("postgresql:///vpay", env) == "vpay@db.internal:6432/vpay"
    # nothing said anywhere: libpq uses its Unix socket and the OS user, not localhost
    assert describe("postgresql:///vpay", {}) == "(os user)@(local socket):5432/vpay"


def test_the_url_wins_and_its_password_never_shows():
    env = {"PGHOST": "elsewhere", "PGUSER": "someone", "PGPASSWORD": "hunter2"}
    out = describe("postgresql://vpay:s3cret@10.0.0.5:5433/pay", env)
    assert out == "vpay@10.0.0.5:5433/pay"
    assert "s3cret" not in out and "hunter2" not in out


def test_a_multi_host_url_names_every_server_in_the_order_libpq_tries_them():
    # docs/deployment.md, "Replication and failover"
    url = "postgresql://vpay:s3cret@db-a:5432,db-b:5433/vpay?target_session_attrs=read-write"
    assert describe(url, {}) == "vpay@db-a:5432,db-b:5433/vpay"
    assert describe("postgresql://vpay@/vpay?host=db-a,db-b&port=6432", {}) == "vpay@db-a:6432,db-b:6432/vpay"
