"""Helpers for the console's tests: a signed-in falcon.testing client that
keeps its cookies and reads each form's CSRF token from the page, and the
situations an operator meets (an unresolved charge, a dead letter, open
alerts), made through the money functions."""

from __future__ import annotations

import re

import falcon.testing

from vpay.console import accounts
from vpay.engine import queue
from vpay.money import charges

PASSWORD = "correct horse battery staple"


def operator(db, email: str, role: str = "operator") -> str:
    accounts.create_operator(db, email, role, PASSWORD)
    return email


class Client:
    """A falcon.testing client with a cookie jar; ``login`` signs in;
    ``post`` sends the page's CSRF token unless told otherwise."""

    def __init__(self, app, address: str = "10.0.0.1"):
        self.client = falcon.testing.TestClient(app)
        self.cookies: dict[str, str] = {}
        self.address = address
        self.csrf = ""

    def _keep(self, result):
        for name, cookie in result.cookies.items():
            if cookie.value == "" or cookie.max_age == 0:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = cookie.value
        m = re.search(r'name="csrf_token" value="([^"]+)"', result.text or "")
        if m:
            self.csrf = m.group(1)
        return result

    def get(self, path: str, headers: dict | None = None, **params):
        return self._keep(self.client.simulate_get(path, params=params or None, cookies=self.cookies,
                                                   remote_addr=self.address, headers=headers))

    def post(self, path: str, form: dict | None = None, *, csrf: str | None = "page", files=None,
             headers: dict | None = None):
        body = dict(form or {})
        if csrf == "page":
            body["csrf_token"] = self.csrf
        elif csrf is not None:
            body["csrf_token"] = csrf
        if files:
            data, ctype = _multipart(body, files)
            return self._keep(self.client.simulate_post(path, body=data, cookies=self.cookies,
                                                        remote_addr=self.address, headers={"Content-Type": ctype}))
        return self._keep(self.client.simulate_post(path, params=None, body=_encode(body), cookies=self.cookies,
                                                    remote_addr=self.address,
                                                    headers={"Content-Type": "application/x-www-form-urlencoded",
                                                             **(headers or {})}))

    def login(self, email: str, password: str = PASSWORD):
        page = self.get("/login")
        token = re.search(r'name="login_token" value="([^"]+)"', page.text).group(1)
        result = self.post("/login", {"email": email, "password": password, "login_token": token}, csrf=None)
        if result.status_code == 303:
            self.get("/")  # picks up the session's CSRF token
        return result


def _multipart(fields: dict, files: dict) -> tuple[bytes, str]:
    """A multipart/form-data body as a browser sends it."""
    boundary = "vpayconsoleboundary7MA4YWxk"
    out = []
    for name, value in fields.items():
        out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, data, ctype) in files.items():
        out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                   f'Content-Type: {ctype}\r\n\r\n'.encode() + data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


def _encode(body: dict) -> str:
    from urllib.parse import urlencode
    return urlencode([(k, v) for k, vs in body.items() for v in (vs if isinstance(vs, list) else [vs])])


def unresolved_charge(db, merchant: str, payer: str = "256770000001") -> dict:
    """A charge escalated at the horizon (unresolved, one charge_unresolved alert)."""
    created = charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                                     payer=payer)
    charge_id = created.charge["id"]
    db.execute("UPDATE charges SET created_at = created_at - interval '25 hours' WHERE id = %s", (charge_id,))
    charges.escalate(db, charge_id, 24 * 3600)
    return charges.load_charge(db, charge_id)


def dead_letter(db, key: str = "k:dead", error: str = "boom") -> int:
    queue.enqueue(db, "test.count", key, {})
    return db.execute("UPDATE jobs SET run_at = 'infinity', last_error = %s WHERE dedupe_key = %s RETURNING id",
                      (error, key)).fetchone()[0]


def alert(db, kind: str = "rail_misconfigured", details: dict | None = None) -> int:
    from psycopg.types.json import Jsonb
    return db.execute("INSERT INTO alerts (kind, details) VALUES (%s, %s) RETURNING id",
                      (kind, Jsonb(details or {}))).fetchone()[0]
