"""The review page (`deid-adapter review serve`): FastAPI, server-rendered HTML and one small script, no build step.

Signed-in reviewers see their own site's held records by priority, one at a time, with every span the stack found
highlighted with its category and confidence; they confirm, reject or re-categorize each span, add missed ones,
and release. A release runs the same engine and leak guard with the decisions applied, writes the audit record
naming the reviewer (durable) and only then the output. Pages never carry a key or another site's data.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from adapter import files as fhir_files
from adapter.audit import trail as audit
from adapter.review.auth import Reviewer, UserStore, csrf_ok
from adapter.review.flow import DecisionError, decide, release
from adapter.review.queue import (
    DISCARDED,
    HELD,
    RELEASED,
    HeldRecord,
    QueueError,
    ReviewQueue,
    Thresholds,
)
from adapter.review.sessions import LoginThrottle, Sessions
from fhir_transforms.errors import DetectorFailed, InputError, RecordRefused
from fhir_transforms.r4.record import Deidentifier
from text_deid.spans import CATEGORIES

WEB = Path(__file__).resolve().parent / "web"
STATIC = {"review.js": "text/javascript", "review.css": "text/css"}
# Digit keys change a span's category to these, in this order; the select on the page offers every category.
SHORTCUTS = ("NAME", "GEOGRAPHIC_LOCATION", "DATE", "PHONE_NUMBER", "EMAIL_ADDRESS", "MEDICAL_RECORD_NUMBER",
             "UNIQUE_IDENTIFIER", "ACCOUNT_NUMBER", "AGE_OVER_89")
HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer",
           "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                      "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"}


@dataclass
class ReviewConfig:
    queue: ReviewQueue
    users: UserStore
    engine: Deidentifier
    thresholds: Thresholds
    out_dir: Path
    audit: Optional[audit.AuditTrail] = None  # None records nothing (--audit off)
    sessions: Optional[Sessions] = None  # None: sessions in the queue's store
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    secure_cookies: bool = False  # set when served over TLS


class Denied(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


def segments(text: str, spans, thresholds: Thresholds) -> list[dict]:
    """The text cut into plain pieces and marked spans (suspect: below its category's threshold), for the template."""
    out, pos = [], 0
    for i, s in enumerate(spans):
        if s.start > pos:
            out.append({"text": text[pos:s.start]})
        out.append({"text": text[s.start:s.end], "span": s, "origin": i, "suspect": thresholds.is_suspect(s)})
        pos = s.end
    if pos < len(text):
        out.append({"text": text[pos:]})
    return out


def create_review_app(config: ReviewConfig) -> FastAPI:
    app = FastAPI(title="deid-adapter review", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Environment(loader=FileSystemLoader(WEB), autoescape=select_autoescape(["html"]))
    releasing = threading.Lock()  # one release at a time per process: an item is never released twice
    sessions = config.sessions or Sessions(config.queue.engine)

    def page(name: str, status: int = 200, **context) -> HTMLResponse:
        html = templates.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def signed_in(request: Request) -> tuple[Reviewer, str]:
        """The reviewer of a live session and its CSRF token (reads the store: call it off the event loop)."""
        found = sessions.read(request.cookies.get(Sessions.COOKIE))
        user = config.users.get(found[0]) if found else None
        if user is None:
            raise Denied(401, "sign in first")
        return user, found[1]

    def check_csrf(request: Request, csrf: str, given: Optional[str]) -> None:
        if not csrf_ok(csrf, given or request.headers.get("x-csrf-token")):
            raise Denied(403, "missing or wrong CSRF token")

    def set_cookie(response: Response, name: str, value: str) -> None:
        response.set_cookie(name, value, httponly=True, samesite="strict", secure=config.secure_cookies,
                            max_age=sessions.max_age_s, path="/")

    def login_page(status: int, error: str, headers: Optional[dict] = None) -> HTMLResponse:
        cookie, csrf = sessions.login_form()
        response = page("login.html", status, csrf=csrf, error=error, user=None)
        response.headers.update(headers or {})
        set_cookie(response, Sessions.LOGIN_COOKIE, cookie)
        return response

    @app.exception_handler(Denied)
    async def denied(request: Request, e: Denied):
        wants_html = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if e.status == 401 and wants_html:
            return RedirectResponse("/login", status_code=303, headers=HEADERS)
        if wants_html:
            return page("error.html", e.status, message=e.message, user=None)
        return JSONResponse({"error": e.message}, status_code=e.status, headers=HEADERS)

    @app.exception_handler(QueueError)
    async def queue_error(_request: Request, e: QueueError):
        return JSONResponse({"error": str(e)}, status_code=503, headers=HEADERS)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/static/{name}")
    async def static(name: str):
        if name not in STATIC:
            raise Denied(404, "not found")
        return FileResponse(WEB / name, media_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    @app.get("/login")
    async def login_form(request: Request):
        return login_page(200, "")

    @app.post("/login")
    async def login(request: Request):
        form = await request.form()
        check_csrf(request, sessions.login_form_csrf(request.cookies.get(Sessions.LOGIN_COOKIE)), form.get("csrf"))
        name, address = str(form.get("name", "")), request.client.host if request.client else ""
        wait = config.throttle.locked_for(name, address)
        if wait:
            return login_page(429, f"Too many failed sign-ins: try again in {int(wait // 60) + 1} minute(s).",
                              {"Retry-After": str(int(wait) + 1)})
        # scrypt takes tens of milliseconds of CPU: off the event loop, so other requests are served meanwhile
        user = await run_in_threadpool(config.users.authenticate, name, str(form.get("password", "")))
        if user is None:
            config.throttle.failed(name, address)
            return login_page(401, "Wrong name or password.")
        config.throttle.succeeded(name)
        cookie, _ = await run_in_threadpool(sessions.start, user.name)
        response = RedirectResponse("/", status_code=303, headers=HEADERS)
        set_cookie(response, Sessions.COOKIE, cookie)
        response.delete_cookie(Sessions.LOGIN_COOKIE, path="/")
        return response

    @app.post("/logout")
    async def logout(request: Request):
        _, csrf = await run_in_threadpool(signed_in, request)
        check_csrf(request, csrf, (await request.form()).get("csrf"))
        await run_in_threadpool(sessions.end, request.cookies.get(Sessions.COOKIE))
        response = RedirectResponse("/login", status_code=303, headers=HEADERS)
        response.delete_cookie(Sessions.COOKIE, path="/")
        return response

    @app.get("/")
    def queue_page(request: Request):
        user, csrf = signed_in(request)
        rows = config.queue.rows(user.site, HELD)
        return page("queue.html", user=user, csrf=csrf, rows=rows)

    @app.get("/records/{item_id}")
    def record_page(request: Request, item_id: str):
        user, csrf = signed_in(request)
        held = config.queue.open(item_id, user.site)
        if held is None:
            raise Denied(404, "no such record at your site")
        if held.status != HELD:
            raise Denied(409, f"this record was {held.status} already")
        return page("record.html", user=user, csrf=csrf, held=held, texts=_view(held, config.thresholds),
                    categories=CATEGORIES, shortcuts=SHORTCUTS, after=_next_id(config.queue, user.site, item_id))

    @app.post("/records/{item_id}/release")
    async def release_record(request: Request, item_id: str):
        user, csrf = await run_in_threadpool(signed_in, request)
        check_csrf(request, csrf, None)
        try:
            body = await request.json()
        except ValueError:
            raise Denied(400, "the body must be JSON") from None
        submitted = body.get("decisions") if isinstance(body, dict) else None
        if not isinstance(submitted, list):
            raise Denied(400, "the body must be {\"decisions\": [...]}")
        return await run_in_threadpool(release_now, user, item_id, submitted)

    def release_now(user: Reviewer, item_id: str, submitted: list) -> JSONResponse:
        with releasing:
            held = config.queue.open(item_id, user.site)
            if held is None:
                raise Denied(404, "no such record at your site")
            if held.status != HELD:
                raise Denied(409, f"this record was {held.status} already")
            try:
                decisions = decide(held, submitted, config.thresholds)
                result = release(config.engine, held, decisions)
            except DecisionError as e:
                raise Denied(400, str(e)) from None
            except (RecordRefused, DetectorFailed, InputError) as e:
                raise Denied(422, f"not released: {str(e).replace(held.resource_type + ':', '').strip()}") from None
            data = fhir_files.serialize([result.resource], False)
            seq = _audit_release(config, user, held, result, decisions, data)
            fhir_files.write_atomic(config.out_dir / f"{held.id}.json", data)
            config.queue.close_item(held.id, user.site, RELEASED, user.name, [d.to_json() for d in decisions],
                                    audit.sha256_of(data))
        nxt = _next_id(config.queue, user.site, item_id)
        return JSONResponse({"status": RELEASED, "id": held.id, "audit_seq": seq,
                             "next": f"/records/{nxt}" if nxt else "/"}, headers=HEADERS)

    @app.get("/admin")
    def admin_page(request: Request):
        user, csrf = signed_in(request)
        if not user.is_admin:
            raise Denied(403, "administrators only")
        rows = config.queue.rows(user.site, None)
        counts = {s: sum(1 for r in rows if r.status == s) for s in (HELD, RELEASED, DISCARDED)}
        return page("admin.html", user=user, csrf=csrf, rows=rows, counts=counts)

    @app.post("/admin/records/{item_id}/discard")
    async def discard(request: Request, item_id: str):
        user, csrf = await run_in_threadpool(signed_in, request)
        if not user.is_admin:
            raise Denied(403, "administrators only")
        form = await request.form()
        check_csrf(request, csrf, form.get("csrf"))
        with releasing:
            row = config.queue.row(item_id, user.site)
            if row is None or row.status != HELD:
                raise Denied(404, "no such held record at your site")
            if config.audit is not None:
                config.audit.record_review(actor=user.name, channel="review", data_format="fhir",
                                           subject_sha256="", decision="discard",
                                           reason=review_reason(form.get("reason")))
            config.queue.close_item(item_id, user.site, DISCARDED, user.name, [])
        return RedirectResponse("/admin", status_code=303, headers=HEADERS)

    return app


# Reasons a discard may give as they are; any other text may name the patient, and is kept only as a hash.
REASONS = ("duplicate", "wrong patient", "test record", "not for release")


def review_reason(given) -> str:
    """What the audit trail keeps of a reviewer's reason: one of REASONS, else `other` and the text's SHA-256."""
    text = str(given or "").strip()
    if not text or text.casefold() in REASONS:
        return text.casefold()
    return f"other sha256:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _view(held: HeldRecord, thresholds: Thresholds) -> list[dict]:
    return [{"index": i, "path": t.path, "segments": segments(t.text, t.spans, thresholds), "text": t.text}
            for i, t in enumerate(held.texts)]


def _next_id(queue: ReviewQueue, site: str, current: str) -> str:
    for row in queue.rows(site, HELD):
        if row.id != current:
            return row.id
    return ""


def _audit_release(config: ReviewConfig, user: Reviewer, held: HeldRecord, result, decisions, data: bytes) -> int:
    """The reviewer's decisions and the release, in one transaction, before the output is written."""
    if config.audit is None:
        return 0
    paths = [t.path for t in held.texts]
    decided = [[paths[d.text], d.start, d.end, d.category, f"review:{d.action}", round(d.confidence, 4)]
               for d in decisions]
    counts: dict[str, int] = {}
    for d in decisions:
        counts[d.action] = counts.get(d.action, 0) + 1
    review_entry = audit.review(actor=user.name, channel="review", data_format="fhir",
                                subject_sha256=audit.sha256_of(data), decision="release", findings=decided)
    review_entry = audit.AuditEntry(**{**review_entry.__dict__, "input_sha256": audit.sha256_of(held.resource),
                                       "detail": {**review_entry.detail, "review_item": held.id, "site": held.site,
                                                  "actions": counts}})
    release_entry = audit.deidentification(config.engine, actor=user.name, channel="review", data_format="fhir",
                                           input=held.resource, output=data, findings=result.findings,
                                           where=held.resource_type, root=held.resource_type)
    try:
        return config.audit.append([review_entry, release_entry])[0]
    except audit.AuditError as e:
        raise Denied(503, f"audit trail unavailable, nothing released: {e}") from None
