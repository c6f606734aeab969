"""The console's pages: each a template and a small resource that calls the
same functions the CLI calls (``vpay.money.operator``, ``vpay.money.resolve``
through ``vpay.money.proposals``, ``vpay.statements.importer``,
``vpay.webhooks``), with the signed-in operator as the audit actor.

Reads are bounded and keyset-paginated (``PAGE`` rows, a "Next" link);
no page reads a table whole."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

import falcon
from psycopg.rows import dict_row

from vpay.base.queries import Q
from vpay.console import accounts
from vpay.console.web import COOKIE, LOGIN_COOKIE, ConsoleApp, new_login_token, set_session_cookie

PAGE = 50

NAV = (("Overview", "/"), ("Payments", "/payments"), ("Unresolved", "/unresolved"), ("Alerts", "/alerts"),
       ("Jobs", "/jobs"), ("Statements", "/statements"), ("Webhooks", "/webhooks"), ("Audit", "/audit"))


def _render(app: ConsoleApp, req: falcon.Request, resp: falcon.Response, template: str,
            http_status: int = 200, **values: Any) -> None:
    session = req.context.session
    resp.status = http_status
    resp.content_type = falcon.MEDIA_HTML
    resp.text = app.templates.get_template(template).render(
        nav=NAV, path=req.path, session=session,
        csrf=session["csrf_token"] if session else "",
        can_act=bool(session) and session["role"] in ("operator", "admin"),
        is_admin=bool(session) and session["role"] == "admin",
        done=values.pop("done", None) or (req.get_param("done") or None),
        error=values.pop("error", None), **values)


def _htmx_target(req: falcon.Request) -> str | None:
    """The element htmx will swap (``HX-Target``), None for a plain request
    or htmx restoring its history (which wants the whole page)."""
    if not req.get_header("HX-Request") or req.get_header("HX-History-Restore-Request"):
        return None
    return req.get_header("HX-Target") or ""


def _whole_main_for_htmx(req: falcon.Request, resp: falcon.Response) -> None:
    """An error or refusal answering htmx replaces the page's ``#main``,
    whatever the request targeted (its message must be seen)."""
    if req.get_header("HX-Request"):
        resp.set_header("HX-Retarget", "#main")
        resp.set_header("HX-Reselect", "#main")
        resp.set_header("HX-Reswap", "outerHTML")


def error_page(app: ConsoleApp):
    """Falcon's error serializer: an HTML page with the error's title and description."""
    def serialize(req, resp, exc):
        _whole_main_for_htmx(req, resp)
        resp.content_type = falcon.MEDIA_HTML
        resp.text = app.templates.get_template("error.html").render(
            nav=NAV, path=req.path, session=getattr(req.context, "session", None), csrf="",
            title=exc.title or "Error", description=exc.description or "", done=None, error=None)
    return serialize


def _actor(req: falcon.Request) -> str:
    return req.context.session["email"]


def _one(form: dict, name: str) -> str:
    value = form.get(name, "")
    if isinstance(value, list):
        value = value[0]
    return value if isinstance(value, str) else ""


def _many(form: dict, name: str) -> list[str]:
    value = form.get(name, [])
    return [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]


def _ids(values: list[str]) -> list[int]:
    try:
        ids = [int(v) for v in values]
    except ValueError:
        raise falcon.HTTPBadRequest(title="Bad id", description="Ids are whole numbers.") from None
    if any(not 0 < i < 2**63 for i in ids):
        raise falcon.HTTPBadRequest(title="Bad id", description="Ids are whole numbers.")
    return ids


def _param(req: falcon.Request, name: str, allowed: tuple[str, ...] | None = None) -> str | None:
    value = (req.get_param(name) or "").strip() or None
    if value is not None and allowed is not None and value not in allowed:
        raise falcon.HTTPBadRequest(title="Bad filter", description=f"{name} must be one of {', '.join(allowed)}.")
    return value


def _int_param(req: falcon.Request, name: str) -> int | None:
    value = _param(req, name)
    return _ids([value])[0] if value else None


def _redirect(path: str, **query: Any) -> None:
    q = {k: v for k, v in query.items() if v not in (None, "")}
    raise falcon.HTTPSeeOther(path + ("?" + urlencode(q) if q else ""))


# -- sign-in ---------------------------------------------------------------

class Login:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp):
        _render(self.app, req, resp, "login.html", login_token=new_login_token(self.app, req, resp))

    def on_post(self, req, resp):
        form = req.context.form
        cookie = req.get_cookie_values(LOGIN_COOKIE)
        token = _one(form, "login_token")
        import hmac
        if not cookie or not token or not hmac.compare_digest(cookie[0], token):
            raise falcon.HTTPForbidden(title="Refused", description="The form's token is missing or wrong; reload.")
        address = req.remote_addr or "unknown"
        with self.app.vpay_db.connection() as conn:
            old = req.get_cookie_values(COOKIE)
            if old:  # a session id from before sign-in is never kept (fixation)
                accounts.sign_out(conn, old[0])
            signed = accounts.sign_in(conn, _one(form, "email"), _one(form, "password"), address)
        if signed is None:
            _render(self.app, req, resp, "login.html", http_status=401, login_token=new_login_token(self.app, req, resp),
                    error="Wrong email or password, or too many attempts: wait and try again.")
            return
        session_id, _op = signed
        set_session_cookie(self.app, resp, session_id, max_age=int(self.app.limits.maximum))
        resp.unset_cookie(LOGIN_COOKIE, path="/login")
        _see_other(resp, "/")


def _see_other(resp: falcon.Response, location: str) -> None:
    # A redirect that keeps the cookies set on resp (raising HTTPSeeOther would drop them).
    resp.status = falcon.HTTP_303
    resp.location = location
    resp.text = ""


class Logout:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_post(self, req, resp):
        with self.app.vpay_db.connection() as conn:
            accounts.sign_out(conn, req.context.session_id)
        resp.unset_cookie(COOKIE, path="/")
        _see_other(resp, "/login")


# -- overview --------------------------------------------------------------

class Overview:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp):
        from vpay.money import overview
        with self.app.vpay_db.connection() as conn:
            snap = overview.snapshot(conn)
        charts = _charts(snap["samples"])
        figures = _figure_charts(snap["figures"])
        _render(self.app, req, resp, "overview.html", snap=snap, charts=charts, figures=figures)


def _polyline(rows: list[dict], key: str, now: float) -> tuple[str, float]:
    """An SVG polyline's points for ``rows[key]`` over the last 24 h (x: 0..300,
    one unit per 288 s; y: 0..60, the peak at the top), and the peak.
    Server-drawn: the page needs no script."""
    top = max([(r[key] or 0.0) for r in rows] + [1.0])
    points = " ".join(f"{300 - (now - r['sampled_at'].timestamp()) / 288:.1f},"
                      f"{60 - 60 * (r[key] or 0.0) / top:.1f}" for r in rows)
    return points, top


def _charts(samples: list[dict]) -> list[dict]:
    """Per lane, the last 24 h of the oldest due job's age."""
    by_lane: dict[str, list[dict]] = {}
    for s in samples:
        by_lane.setdefault(s["lane"], []).append(s)
    charts = []
    now = datetime.now(timezone.utc).timestamp()
    for lane, rows in sorted(by_lane.items()):
        points, top = _polyline(rows, "oldest_due_seconds", now)
        charts.append({"lane": lane, "points": points, "top": top,
                       "due_now": rows[-1]["due"], "samples": len(rows)})
    return charts


FIGURES = (("poll_late_seconds", "Poll lateness (the most overdue status read)", "age"),
           ("settle_p50_seconds", "Settle time, median (created to settled)", "age"),
           ("settle_p95_seconds", "Settle time, 95th percentile", "age"),
           ("workers", "Workers alive", "count"))
"""The overview's figure charts: (column of console_figures, title, unit)."""


def _figure_charts(figures: list[dict]) -> list[dict]:
    """The last 24 h of each ``FIGURES`` column: ``[{title, unit, points,
    top, last, samples}]``; empty without samples."""
    if not figures:
        return []
    now = datetime.now(timezone.utc).timestamp()
    charts = []
    for key, title, unit in FIGURES:
        points, top = _polyline(figures, key, now)
        charts.append({"key": key, "title": title, "unit": unit, "points": points, "top": top,
                       "last": figures[-1][key], "samples": len(figures)})
    return charts


# -- payments --------------------------------------------------------------

RAILS = ("mtn", "orange", "mpesa", "pawapay")
STATUSES = ("pending", "unresolved", "succeeded", "failed")


def _time_param(req: falcon.Request, name: str) -> datetime | None:
    """A ``created_from``/``created_to`` filter: a date (``2026-12-04``) or a
    date and time (``2026-12-04T16:45``, as ``<input type=datetime-local>``
    sends it), read as UTC like every time the console shows; an explicit
    offset is kept. 400 when unreadable."""
    value = _param(req, name)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise falcon.HTTPBadRequest(title="Bad filter",
                                    description=f"{name}: a date (2026-12-04) or a UTC time (2026-12-04T16:45).") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _time_value(value: datetime | None) -> str:
    """A time filter as the form shows it back (UTC, to the minute)."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M") if value else ""


class Payments:
    """``GET /payments``: the search box and the filters (status, rail,
    merchant, created from/to), newest first, keyset-paginated; one hit of
    a search opens the payment. Asked by htmx for ``#results`` (the search
    form, the next-page link), only the results are rendered; without
    script the whole page is."""

    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp):
        q = _param(req, "q")
        status = _param(req, "status", STATUSES)
        rail = _param(req, "rail", RAILS)
        merchant = _param(req, "merchant")
        since, until = _time_param(req, "created_from"), _time_param(req, "created_to")
        if since and until and since >= until:
            raise falcon.HTTPBadRequest(title="Bad filter", description="created_from must be before created_to.")
        before = _param(req, "before")
        before_created, before_id = None, None
        if before:
            try:
                stamp, before_id = before.rsplit("|", 1)
                before_created = datetime.fromisoformat(stamp)
            except ValueError:
                raise falcon.HTTPBadRequest(title="Bad page", description="Unreadable page marker.") from None
        with self.app.vpay_db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            # Unprepared: planned with its values, so the absent filters fold
            # away and the present one's index is used (sql/queries/console.sql).
            rows = cur.execute(Q["console_payment_search"], {
                "q": q, "status": status, "rail": rail, "merchant": merchant, "since": since, "until": until,
                "before_created": before_created, "before_id": before_id, "limit": PAGE + 1},
                prepare=False).fetchall()
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        filters = {"q": q, "status": status, "rail": rail, "merchant": merchant,
                   "created_from": _time_value(since), "created_to": _time_value(until)}
        next_q = None
        if more:
            last = rows[-1]
            next_q = urlencode({k: v for k, v in {
                **filters, "before": f"{last['created_at'].isoformat()}|{last['id']}"}.items() if v})
        partial = _htmx_target(req) == "results"
        if q and len(rows) == 1 and not before:
            if partial:  # htmx: a whole-page visit to the payment, not a swap
                resp.set_header("HX-Redirect", f"/payments/{rows[0]['id']}")
                resp.status, resp.text = falcon.HTTP_200, ""
                return
            _redirect(f"/payments/{rows[0]['id']}")
        callbacks = None
        if q and not rows and not before:  # a callback may name a reference no charge has
            with self.app.vpay_db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                callbacks = cur.execute(Q["rail_callbacks_of_reference"], {"reference": q[:200]}).fetchone()
        _render(self.app, req, resp, "payments_results.html" if partial else "payments.html", rows=rows,
                q=q or "", status=status or "",
                rail=rail or "", merchant=merchant or "", created_from=filters["created_from"],
                created_to=filters["created_to"], rails=RAILS, statuses=STATUSES, next_q=next_q,
                callbacks=callbacks)


class Payment:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp, charge_id: str):
        from vpay.money import proposals
        from vpay.money.charges import show
        with self.app.vpay_db.connection() as conn:
            found = show(conn, charge_id)
            if found is None:
                raise falcon.HTTPNotFound(title="Not found", description=f"No payment {charge_id}.")
            charge = next((c for c in found["charges"] if c["id"] == charge_id), found["charges"][-1])
            with conn.cursor(row_factory=dict_row) as cur:
                calls = cur.execute(Q["rail_calls_of_charge"], {"charge_id": charge["id"], "limit": 200}).fetchall()
                callbacks = cur.execute(Q["rail_callbacks_of_charge"],
                                        {"charge_id": charge["id"], "limit": 200}).fetchall()
                alerts = cur.execute(Q["console_alerts_of_charge"], {"charge_id": charge["id"]}).fetchall()
                event_ids = [e["id"] for e in found["events"]]
                deliveries = cur.execute(Q["console_deliveries_of_events"], {"ids": event_ids}).fetchall()
                evidence = cur.execute(Q["console_evidence_of_charge"], {"charge_id": charge["id"]}).fetchall()
                refunds = cur.execute(Q["console_refunds_of_charge"], {"charge_id": charge["id"]}).fetchall()
                actions = cur.execute(Q["audit_of_targets"], {"targets": [f"charge:{charge['id']}"]}).fetchall()
                poll = cur.execute(Q["op_charge_polls"], {"keys": [f"poll:{charge['id']}"]}).fetchone()
            props = proposals.of_charges(conn, [charge["id"]])
        timeline = _timeline(found, charge, calls, alerts, deliveries, evidence, actions, props, callbacks)
        _render(self.app, req, resp, "payment.html", intent=found["payment_intent"], charge=charge,
                payer=charge["payer"], rail_transaction_id=charge["rail_transaction_id"], timeline=timeline,
                refunds=refunds, poll=poll, charges=found["charges"])


def _ts(value) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


CALLBACK_ACTIONS = {
    "pulled_forward": "pulled the status read forward to now",
    "enqueued": "queued a status read (there was none)",
    "spaced": "pulled the status read forward to 10 s after the last one",
    "polled_recently": "left alone: the status was read moments ago",
    "leased": "left alone: a status read was in progress",
    "dead_lettered": "left alone: the status read is a dead letter",
    "due_soon": "left alone: a status read was due within 10 s",
    "raced": "left alone: the status read changed meanwhile",
}
"""What a callback did (``rail_callbacks.action``, vpay.api.callbacks.apply_hint), in words."""


def _timeline(found, charge, calls, alerts, deliveries, evidence, actions, props, callbacks=()) -> list[dict]:
    """The payment's story, oldest first: ``[{at, what, detail}]``."""
    items = [{"at": _ts(charge.get("created_at")), "what": "created",
              "detail": f"intent {found['payment_intent']['id']}, charge {charge['id']}"}]
    c = charge
    if c.get("submitted_at"):
        items.append({"at": _ts(c["submitted_at"]), "what": "request to pay",
                      "detail": f"accepted by {c['rail']} (reference {c['rail_reference']})"})
    for r in calls:
        items.append({"at": r["created_at"], "what": f"rail {r['operation']}",
                      "detail": f"{r['answer']} (HTTP {r['http_status'] if r['http_status'] is not None else '-'}"
                                f", {r['latency_ms']} ms){': ' + r['reason'] if r['reason'] else ''}"})
    for cb in callbacks:
        items.append({"at": cb["created_at"], "what": f"callback from {cb['rail']}",
                      "detail": CALLBACK_ACTIONS.get(cb["action"], cb["action"])})
    if c.get("unresolved_at"):
        items.append({"at": _ts(c["unresolved_at"]), "what": "escalated", "detail": "unresolved at the horizon"})
    if c.get("settled_at"):
        items.append({"at": _ts(c["settled_at"]), "what": "settled",
                      "detail": f"{c['status']}{' (' + c['failure_code'] + ')' if c.get('failure_code') else ''}"})
    for e in found["events"]:
        items.append({"at": _ts(e.get("created") or e.get("created_at")), "what": "event",
                      "detail": f"{e['type']} {e['id']}"})
    for d in deliveries:
        items.append({"at": d["updated_at"], "what": "webhook",
                      "detail": f"{d['event_id']} to {d['url']}: {d['status']}, {d['attempts']} attempts, "
                                f"last HTTP {d['last_status_code'] or '-'}{': ' + d['last_error'] if d['last_error'] else ''}"})
    for a in alerts:
        items.append({"at": a["created_at"], "what": f"alert {a['kind']}",
                      "detail": ("acknowledged: " + (a["note"] or "")) if a["acknowledged_at"] else "open"})
    for ev in evidence:
        items.append({"at": ev["created_at"], "what": "evidence",
                      "detail": f"{ev['outcome']} by {ev['source']}: {ev['evidence']}"})
    for p in props:
        items.append({"at": p["proposed_at"], "what": "proposal",
                      "detail": f"{p['proposed_by']} proposed {p['outcome']}: {p['evidence']} ({p['state']}"
                                f"{' by ' + p['decided_by'] if p['decided_by'] else ''})"})
    for a in actions:
        items.append({"at": a["created_at"], "what": f"operator {a['action']}",
                      "detail": f"{a['actor']}: {a['result']}{' - ' + a['note'] if a['note'] else ''}"})
    return sorted(items, key=lambda i: (i["at"] is None, i["at"] or datetime.min.replace(tzinfo=timezone.utc)))


# -- unresolved workbench --------------------------------------------------

class Unresolved:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp):
        from vpay.money import proposals
        after = _param(req, "after")
        after_created, after_id = None, None
        if after:
            try:
                stamp, after_id = after.rsplit("|", 1)
                after_created = datetime.fromisoformat(stamp)
            except ValueError:
                raise falcon.HTTPBadRequest(title="Bad page", description="Unreadable page marker.") from None
        with self.app.vpay_db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q["console_unresolved"], {"after_created": after_created, "after_id": after_id,
                                                         "limit": PAGE + 1}).fetchall()
            more = len(rows) > PAGE
            rows = rows[:PAGE]
            props = {p["id"]: p for p in proposals.of_charges(conn, [r["id"] for r in rows]) if p["state"] == "open"}
            lines = {r["id"]: cur.execute(Q["console_statement_lines_of_charge"],
                                          {"charge_id": r["id"], "reference": r["rail_reference"]}).fetchall()
                     for r in rows if r["statement_lines"]}
        next_q = urlencode({"after": f"{rows[-1]['created_at'].isoformat()}|{rows[-1]['id']}"}) if more else None
        _render(self.app, req, resp, "unresolved.html", rows=rows, proposals=props, lines=lines, next_q=next_q,
                me=_actor(req))


class Propose:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_post(self, req, resp, charge_id: str):
        from vpay.money import proposals
        from vpay.money.audit import audited
        form = req.context.form
        outcome, evidence = _one(form, "outcome"), _one(form, "evidence")
        with self.app.vpay_db.connection() as conn:
            try:
                with audited(conn, actor=_actor(req), action="charges.propose", target=f"charge:{charge_id}",
                             note=f"{outcome}: {evidence}"[:2000], via="console"):
                    proposals.propose(conn, charge_id, outcome, evidence, _actor(req))
            except (proposals.Refused, ValueError) as exc:
                return _refused(self.app, req, resp, str(exc))
        _redirect("/unresolved", done=f"Proposed {outcome} for {charge_id}; another operator approves it.")


class Decide:
    """``POST /proposals/{id}/{approve|reject|withdraw}``."""

    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_post(self, req, resp, proposal_id: str, decision: str):
        from vpay.money import proposals
        from vpay.money.audit import audited
        if decision not in ("approve", "reject", "withdraw"):
            raise falcon.HTTPNotFound()
        pid = _ids([proposal_id])[0]
        note = _one(req.context.form, "note") or None
        with self.app.vpay_db.connection() as conn:
            with conn.cursor() as cur:
                row = cur.execute("SELECT charge_id FROM resolution_proposals WHERE id = %s", (pid,)).fetchone()
            target = f"charge:{row[0]}" if row else f"proposal:{pid}"
            try:
                with audited(conn, actor=_actor(req), action=f"charges.{decision}", target=target,
                             note=note, via="console") as done:
                    fn = {"approve": proposals.approve, "reject": proposals.reject,
                          "withdraw": proposals.withdraw}[decision]
                    result = fn(conn, pid, _actor(req), note) if decision == "approve" else \
                        fn(conn, pid, _actor(req), note or "")
                    done.result = f"ok: proposal {pid} {result['proposal']['state'] if decision == 'approve' else result['state']}"
            except (proposals.Refused, ValueError) as exc:
                return _refused(self.app, req, resp, str(exc))
        _redirect("/unresolved", done=f"Proposal {pid}: {decision} done.")


def _refused(app, req, resp, message: str) -> None:
    """A refused action: 409 with the reason on an error page; nothing changed."""
    _whole_main_for_htmx(req, resp)
    resp.status = falcon.HTTP_409
    resp.content_type = falcon.MEDIA_HTML
    resp.text = app.templates.get_template("error.html").render(
        nav=NAV, path=req.path, session=req.context.session, csrf=req.context.session["csrf_token"],
        title="Refused, nothing changed", description=message, done=None, error=None)


# -- alerts ----------------------------------------------------------------

class Alerts:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def _filters(self, req) -> tuple[str | None, str | None]:
        from vpay.money.alert_kinds import ALERT_KINDS
        return _param(req, "kind", tuple(ALERT_KINDS)), _param(req, "state", ("open", "acknowledged"))

    def on_get(self, req, resp):
        from vpay.money.alert_kinds import ALERT_KINDS
        kind, state = self._filters(req)
        after = _int_param(req, "after")
        with self.app.vpay_db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q["console_alerts_page"], {"kind": kind, "state": state, "after": after,
                                                          "limit": PAGE + 1}).fetchall()
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        next_q = urlencode({k: v for k, v in {"kind": kind, "state": state, "after": rows[-1]["id"]}.items() if v}) \
            if more else None
        _render(self.app, req, resp, "alerts.html", rows=rows, kind=kind or "", state=state or "",
                kinds=ALERT_KINDS, next_q=next_q)

    def on_post_ack(self, req, resp):
        from vpay.money.alert_kinds import ALERT_KINDS
        from vpay.money.operator import ack, check_note, list_alerts
        form = req.context.form
        kind = _one(form, "kind") or None
        if kind is not None and kind not in ALERT_KINDS:
            raise falcon.HTTPBadRequest(title="Bad filter", description="Unknown alert kind.")
        every = _one(form, "every") == "1"
        try:
            note = check_note(_one(form, "note"))
        except ValueError as exc:
            return _refused(self.app, req, resp, str(exc))
        with self.app.vpay_db.connection() as conn:
            ids = [r["id"] for r in list_alerts(conn, open_only=True, kind=kind)] if every \
                else _ids(_many(form, "id"))
            if not ids:
                return _refused(self.app, req, resp, "No alert chosen (tick some, or acknowledge every match).")
            try:
                rows = ack(conn, ids, note, _actor(req), via="console")
            except ValueError as exc:
                return _refused(self.app, req, resp, str(exc))
        _redirect("/alerts", kind=kind, state="open", done=f"Acknowledged {len(rows)} alert(s).")


# -- jobs ------------------------------------------------------------------

class Jobs:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp):
        from vpay.engine.lanes import LANES
        state = _param(req, "state", ("dead", "stranded")) or "dead"
        lane = _param(req, "lane", tuple(LANES))
        kind = _param(req, "kind")
        after = _int_param(req, "after")
        with self.app.vpay_db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q["console_jobs_page"], {"state": state, "kind": kind, "lane": lane,
                                                        "after": after, "limit": PAGE + 1}).fetchall()
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        next_q = urlencode({k: v for k, v in {"state": state, "kind": kind, "lane": lane,
                                               "after": rows[-1]["id"]}.items() if v}) if more else None
        _render(self.app, req, resp, "jobs.html", rows=rows, state=state, lane=lane or "", kind=kind or "",
                lanes=LANES, next_q=next_q)

    def _act(self, req, resp, action: str):
        from vpay.money.operator import check_note, list_jobs, release, retry
        form = req.context.form
        every = _one(form, "every") == "1"
        kind, lane = _one(form, "kind") or None, _one(form, "lane") or None
        note = None
        if action == "retry":
            try:
                note = check_note(_one(form, "note") or "retried by an operator")
            except ValueError as exc:
                return _refused(self.app, req, resp, str(exc))
        with self.app.vpay_db.connection() as conn:
            if every:
                ids = [r["id"] for r in list_jobs(conn, dead=action == "retry", stranded=action == "release",
                                                  kind=kind, lane=lane)]
            else:
                ids = _ids(_many(form, "id"))
            if not ids:
                return _refused(self.app, req, resp, "No job chosen.")
            try:
                rows = retry(conn, ids, note, _actor(req), via="console") if action == "retry" \
                    else release(conn, ids, _actor(req), via="console")
            except ValueError as exc:
                return _refused(self.app, req, resp, str(exc))
        _redirect("/jobs", state="dead" if action == "retry" else "stranded",
                  done=f"{'Retried' if action == 'retry' else 'Released'} {len(rows)} job(s).")

    def on_post_retry(self, req, resp):
        return self._act(req, resp, "retry")

    def on_post_release(self, req, resp):
        return self._act(req, resp, "release")


# -- statements ------------------------------------------------------------

class Statements:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp):
        from vpay.statements.importer import list_statements
        from vpay.statements.profiles import PROFILES
        with self.app.vpay_db.connection() as conn:
            rows = list_statements(conn, PAGE)
        _render(self.app, req, resp, "statements.html", rows=rows, profiles=sorted(PROFILES), report=None)

    def on_get_one(self, req, resp, statement_id: str):
        from vpay.statements import importer
        with self.app.vpay_db.connection() as conn:
            found = importer.show(conn, statement_id)
        if found is None:
            raise falcon.HTTPNotFound(title="Not found", description=f"No statement {statement_id}.")
        _render(self.app, req, resp, "statement.html", report=found, payload=None)

    def on_post_import(self, req, resp):
        """Upload (``file``) or re-post (``payload``, base64 of the dry run's
        bytes) a statement; ``apply=1`` applies, else a dry run."""
        from vpay.statements import importer
        from vpay.statements.profiles import BadMap, choose
        from vpay.statements.reader import BadFile
        form = req.context.form
        rail = _one(form, "rail")
        if rail not in ("mtn", "orange"):
            return _refused(self.app, req, resp, "Choose the statement's rail.")
        profile_name = _one(form, "profile") or None
        upload = form.get("file")
        if isinstance(upload, tuple) and upload[1]:
            name, data = upload
        else:
            try:
                data = base64.b64decode(_one(form, "payload"), validate=True)
            except (binascii.Error, ValueError):
                data = b""
            name = _one(form, "file_name") or "statement.csv"
        if not data:
            return _refused(self.app, req, resp, "Choose a statement file.")
        apply = _one(form, "apply") == "1"
        try:
            profile = choose(profile_name, None)
        except BadMap as exc:
            return _refused(self.app, req, resp, str(exc))
        with self.app.vpay_db.connection() as conn:
            try:
                result = importer.run_audited(conn, data, actor=_actor(req), via="console", rail=rail,
                                              profile=profile, file_name=name[:200], apply=apply)
            except BadFile as exc:
                return _refused(self.app, req, resp, f"{name}: {exc}")
        payload = None if apply or result.get("already_imported") else base64.b64encode(data).decode()
        _render(self.app, req, resp, "statement.html", report=result, payload=payload, rail=rail,
                profile=profile_name or "", file_name=name)


# -- webhooks --------------------------------------------------------------

class Webhooks:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp):
        merchant = _param(req, "merchant")
        after = _param(req, "after")
        event = _param(req, "event")
        endpoint = _param(req, "endpoint")
        with self.app.vpay_db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q["console_endpoints_page"], {"merchant": merchant, "after": after,
                                                             "limit": PAGE + 1}).fetchall()
            deliveries = cur.execute(Q["console_deliveries_page"], {"event": event, "endpoint": endpoint,
                                                                    "limit": PAGE}).fetchall() \
                if (event or endpoint) else []
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        next_q = urlencode({k: v for k, v in {"merchant": merchant, "after": rows[-1]["id"]}.items() if v}) \
            if more else None
        _render(self.app, req, resp, "webhooks.html", rows=rows, merchant=merchant or "", next_q=next_q,
                deliveries=deliveries, event=event or "", endpoint=endpoint or "")

    def on_post_endpoint(self, req, resp, endpoint_id: str, action: str):
        from vpay import webhooks
        from vpay.money.audit import audited
        if action not in ("enable", "disable"):
            raise falcon.HTTPNotFound()
        with self.app.vpay_db.connection() as conn:
            with audited(conn, actor=_actor(req), action=f"webhooks.{action}", target=f"endpoint:{endpoint_id}",
                         via="console") as done:
                row = webhooks.disable_endpoint(conn, endpoint_id, "disabled by an operator") \
                    if action == "disable" else webhooks.enable_endpoint(conn, endpoint_id)
                done.result = "ok" if row else "refused: unknown endpoint"
        if row is None:
            raise falcon.HTTPNotFound(title="Not found", description=f"No endpoint {endpoint_id}.")
        _redirect("/webhooks", done=f"Endpoint {endpoint_id}: {action}d.")

    def on_post_redeliver(self, req, resp):
        from vpay import webhooks
        from vpay.money.audit import audited
        form = req.context.form
        event_id, endpoint_id = _one(form, "event"), _one(form, "endpoint")
        with self.app.vpay_db.connection() as conn:
            with audited(conn, actor=_actor(req), action="webhooks.redeliver", target=f"event:{event_id}",
                         note=f"to {endpoint_id}", via="console") as done:
                job = webhooks.redeliver(conn, event_id, endpoint_id)
                done.result = f"ok: job {job}" if job else "refused: unknown, disabled or in flight"
        if job is None:
            return _refused(self.app, req, resp, "Cannot redeliver: unknown event or endpoint, another merchant's, "
                                                 "a disabled endpoint, or a delivery in flight.")
        _redirect("/webhooks", event=event_id, done=f"Redelivery of {event_id} to {endpoint_id} queued.")


# -- audit -----------------------------------------------------------------

class Audit:
    def __init__(self, app: ConsoleApp):
        self.app = app

    def on_get(self, req, resp):
        from vpay.money.audit import list_actions
        before = _int_param(req, "before")
        actor, target = _param(req, "actor"), _param(req, "target")
        with self.app.vpay_db.connection() as conn:
            rows = list_actions(conn, actor=actor, target=target, before=before, limit=PAGE + 1)
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        next_q = urlencode({k: v for k, v in {"actor": actor, "target": target,
                                               "before": rows[-1]["id"]}.items() if v}) if more else None
        _render(self.app, req, resp, "audit.html", rows=rows, actor=actor or "", target=target or "", next_q=next_q)


def add_routes(app: ConsoleApp) -> None:
    """Every page and action of the console."""
    app.add_route("/login", Login(app))
    app.add_route("/logout", Logout(app))
    app.add_route("/", Overview(app))
    app.add_route("/payments", Payments(app))
    app.add_route("/payments/{charge_id}", Payment(app))
    app.add_route("/unresolved", Unresolved(app))
    app.add_route("/unresolved/{charge_id}/propose", Propose(app))
    app.add_route("/proposals/{proposal_id}/{decision}", Decide(app))
    alerts = Alerts(app)
    app.add_route("/alerts", alerts)
    app.add_route("/alerts/ack", alerts, suffix="ack")
    jobs = Jobs(app)
    app.add_route("/jobs", jobs)
    app.add_route("/jobs/retry", jobs, suffix="retry")
    app.add_route("/jobs/release", jobs, suffix="release")
    st = Statements(app)
    app.add_route("/statements", st)
    app.add_route("/statements/import", st, suffix="import")
    app.add_route("/statements/{statement_id}", st, suffix="one")
    wh = Webhooks(app)
    app.add_route("/webhooks", wh)
    app.add_route("/webhooks/endpoints/{endpoint_id}/{action}", wh, suffix="endpoint")
    app.add_route("/webhooks/redeliver", wh, suffix="redeliver")
    app.add_route("/audit", Audit(app))
