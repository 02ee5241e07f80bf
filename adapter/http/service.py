"""The FHIR `$de-identify` operation over HTTP (FastAPI). The same engine, rules, keys and stacks as the CLI.

Errors are OperationOutcomes: 400 bad JSON or invalid FHIR, 401/403 auth, 408 body too slow, 413 too large or
too costly, 415 media type, 422 refused (leak guard, unknown modifierExtension), 429 the client's limit, 503 a
detector unavailable, failed or late, or the memory budget taken (with Retry-After), 500 only for bugs.
Nothing partial is ever returned. Logs and metrics carry client, operation, status, sizes, duration and
the document hash, never PHI.
"""
from __future__ import annotations

import asyncio
import ctypes
import gc
import hashlib
import json
import logging
import time
from contextlib import asynccontextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from adapter import json_input
from adapter.http import admission
from adapter.http.auth import Client, TokenStore
from fhir_transforms import dates, safe_harbor_gaps
from fhir_transforms.errors import DetectorFailed, InputError, LeakFound, RecordRefused
from fhir_transforms.keys import Key
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4 import versions
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.rules import MAPPINGS, ProfileError, load_profile, profile_names
from text_deid import budget
from text_deid.stack import DEFAULT_STACK, STACKS, LlmSettings, StackUnavailable
import conformance
from adapter.audit.trail import AuditError
from fhir_transforms.hl7v2 import message as er7
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.hl7v2.rules import load_hl7_profile
from adapter.engines import Profiles, text_stack

FHIR_JSON = "application/fhir+json"
JSON_TYPES = (FHIR_JSON, "application/json")
OPERATION_PARAMETERS = ("resource", "profile", "stack", "fhirVersion")  # $de-identify's in-parameters
HL7_TYPES = ("x-application/hl7-v2+er7", "application/hl7-v2", "text/plain")
CONFORMANCE = Path(conformance.__file__).resolve().parent
access_log = logging.getLogger("deid_adapter.access")
log = logging.getLogger("deid_adapter.serve")


# Why a record was not written → (HTTP status, OperationOutcome issue code); first match, subclasses first.
HTTP_STATUS: dict[type[Exception], tuple[int, str]] = {
    InputError: (400, "invalid"), DetectorFailed: (503, "transient"), LeakFound: (422, "security"),
    RecordRefused: (422, "business-rule"),
}


@dataclass
class ServiceConfig:
    key: Key
    tokens: TokenStore
    profile: str = "safe-harbor"
    stack: str | None = None
    max_body_bytes: int = 20 * 1024 * 1024
    timeout_s: float = 120.0
    workers: int = 2
    clock: Callable[[], date] = dates.today
    audit: object | None = None  # adapter.audit.trail.AuditTrail; None records nothing (--audit off)
    engines: dict = field(default_factory=dict)  # by (profile, stack) as loaded, never as a request spelled them
    llm: LlmSettings | None = None  # the Ollama endpoint of the LLM stacks (None: the environment)
    site: Profiles | None = None  # --rules: the site rules over `profile`, for every request (no other profile)
    fhir_version: str = versions.DEFAULT  # r4, r5 or auto, unless a request names its version
    charset: str = ""  # HL7v2: the codec of messages whose MSH-18 is empty (--charset), else the site rules file's
    max_inflight_mb: float = field(default_factory=admission.default_budget_mb)  # estimated memory of all requests
    per_client_concurrency: int = 0  # a client's requests at once (0: all workers but one)
    per_client_queue: int = 8  # a client's requests waiting beyond those
    body_timeout_s: float = 30.0  # the whole body must arrive within this


class HttpError(Exception):
    def __init__(self, status: int, code: str, diagnostics: str, retry_after: int | None = None):
        self.status, self.code, self.diagnostics, self.retry_after = status, code, diagnostics, retry_after


def outcome(code: str, diagnostics: str, severity: str = "error") -> dict:
    return {"resourceType": "OperationOutcome",
            "issue": [{"severity": severity, "code": code, "diagnostics": diagnostics}]}


def served(registry: CollectorRegistry) -> str:
    """The shutdown counts: $de-identify requests answered, by status class, and the records refused."""
    by_class: dict[str, int] = {}
    refused = 0
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "deid_requests_total" and sample.labels["operation"] in ("fhir", "hl7v2"):
                status = f"{sample.labels['status'][0]}xx"
                by_class[status] = by_class.get(status, 0) + int(sample.value)
            elif sample.name == "deid_refusals_total":
                refused += int(sample.value)
    answered = ", ".join(f"{n} {status}" for status, n in sorted(by_class.items()))
    return (f"{sum(by_class.values())} $de-identify request(s) answered{f' ({answered})' if answered else ''}, "
            f"{refused} record(s) refused")


def not_safe_harbor(profile) -> dict:
    """The information an output of rules with gaps carries: what they are, and that they are not Safe Harbor."""
    gaps = [str(g) for g in profile.safe_harbor_gaps]
    return outcome("informational", f"not de-identified under HIPAA Safe Harbor: the rules "
                   f"({safe_harbor_gaps.label(profile)}) keep more than it allows: {'; '.join(gaps)}", "information")


def create_app(config: ServiceConfig) -> FastAPI:
    pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="deid")
    per_client = config.per_client_concurrency or max(1, config.workers - 1)  # one worker left for the others
    admitted = admission.Admission(config.max_inflight_mb, per_client, config.per_client_queue)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        pool.shutdown(wait=False, cancel_futures=True)
        log.info("deid-adapter serve: stopped; %s", served(registry))

    # no /openapi.json: the operations are described by the CapabilityStatement behind a token (/metadata)
    app = FastAPI(title="deid-adapter", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(_request: Request, e: StarletteHTTPException) -> Response:
        """No such route (404) or method (405): an OperationOutcome like every other error."""
        code = {404: "not-found", 405: "not-supported"}.get(e.status_code, "processing")
        return Response(json.dumps(outcome(code, str(e.detail))).encode(), status_code=e.status_code,
                        media_type=FHIR_JSON, headers=getattr(e, "headers", None))

    registry = CollectorRegistry()
    requests_total = Counter("deid_requests_total", "Requests by operation and status", ["operation", "status"],
                             registry=registry)
    latency = Histogram("deid_request_seconds", "Request latency", ["operation"], registry=registry,
                        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))
    refusals = Counter("deid_refusals_total", "Refused records by reason", ["reason"], registry=registry)
    detector_time = Histogram("deid_detector_seconds", "Detector wall time per record", ["detector"], registry=registry)

    def engine(profile: str | None, stack: str | None) -> Deidentifier:
        # load_profile and build_stack accept only exact known names, so the cache holds at most one
        # engine per profile x stack, however many spellings requests try
        if config.site is not None and profile not in (None, config.profile):
            raise HttpError(400, "invalid", f"this service de-identifies with site rules over {config.profile}: "
                                            "a request cannot name another profile")
        key = (profile or config.profile, stack or config.stack or DEFAULT_STACK)
        if key[0] not in profile_names(MAPPINGS):  # never echoed: a request's strings stay out of answers and logs
            raise HttpError(400, "invalid", f"unknown profile (known: {', '.join(sorted(profile_names(MAPPINGS)))})")
        if key[1] not in STACKS:
            raise HttpError(400, "invalid", f"unknown stack (known: {', '.join(STACKS)})")
        if key not in config.engines:
            try:
                rules = config.site.fhir if config.site is not None else load_profile(key[0])
                config.engines[key] = Deidentifier(rules, Pseudonymizer(config.key),
                                                   text_stack(key[1], config.llm), config.clock, True)
            except ProfileError as e:
                raise HttpError(400, "invalid", str(e)) from None
            except StackUnavailable as e:
                raise HttpError(503, "transient", str(e)) from None
        return config.engines[key]

    def authorize(request: Request, operation: str) -> Client:
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            raise HttpError(401, "login", "a bearer token is required")
        client = config.tokens.authenticate(header[7:].strip())
        if client is None:
            raise HttpError(401, "login", "unknown token")
        if operation not in client.operations:
            raise HttpError(403, "forbidden", f"client may not call {operation}")
        return client

    async def body(request: Request, types: tuple[str, ...]) -> bytes:
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media not in types:
            raise HttpError(415, "not-supported", f"content type must be one of {', '.join(types)}")
        if "content-length" in request.headers and "transfer-encoding" in request.headers:
            # request smuggling's shape (RFC 9112 6.3): a proxy and this server could read different bodies
            raise HttpError(400, "structure", "a request may not have both Content-Length and Transfer-Encoding")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > config.max_body_bytes:
            raise HttpError(413, "too-costly", f"request body over {config.max_body_bytes} bytes")
        chunks, size = [], 0
        stream = request.stream().__aiter__()
        late = asyncio.get_running_loop().time() + config.body_timeout_s  # a slow client holds no socket for long
        while True:
            try:
                chunk = await asyncio.wait_for(stream.__anext__(), late - asyncio.get_running_loop().time())
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise HttpError(408, "timeout", f"request body not received within {config.body_timeout_s:.0f} s") \
                    from None
            size += len(chunk)
            if size > config.max_body_bytes:
                raise HttpError(413, "too-costly", f"request body over {config.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def run(fn, *args, cost_mb: float = 0.0):
        try:
            release = admitted.reserve(cost_mb)
        except admission.TooCostly as e:
            raise HttpError(413, "too-costly", str(e)) from None
        except admission.Busy as e:
            raise HttpError(e.status, "transient", e.diagnostics, admission.RETRY_AFTER_S) from None
        deadline = time.monotonic() + config.timeout_s  # the worker's text detectors stop there too
        work = pool.submit(_until, deadline, fn, *args)
        work.add_done_callback(lambda _: release())  # when the worker is done, not when the answer is sent
        try:
            return await asyncio.wait_for(asyncio.wrap_future(work), config.timeout_s)
        except asyncio.TimeoutError:
            raise HttpError(503, "timeout", f"de-identification took longer than {config.timeout_s:.0f} s") from None

    def respond(status: int, payload, media: str = FHIR_JSON, retry_after: int | None = None) -> Response:
        if isinstance(payload, (dict, list)):
            content = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()
        else:
            content = payload.encode() if isinstance(payload, str) else payload
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return Response(content, status_code=status, media_type=media, headers=headers)

    async def handle(request: Request, operation: str, work) -> Response:
        start = time.perf_counter()
        client_name, digest, size_in, status = "-", "-", 0, 500
        try:
            client = authorize(request, operation)
            client_name = request.state.client = client.name
            try:
                async with admitted.client_slot(client.name):
                    response, digest, size_in = await work(request)
            except admission.Busy as e:
                raise HttpError(e.status, "throttled", e.diagnostics, admission.RETRY_AFTER_S) from None
            status = response.status_code
            return response
        except HttpError as e:
            status = e.status
            if status in (413, 422, 429, 503):
                refusals.labels(e.code).inc()
            return respond(status, outcome(e.code, e.diagnostics), retry_after=e.retry_after)
        except Exception as e:  # a bug: log and answer its type only, never its message (it may quote input)
            access_log.error("internal error: %s", type(e).__name__)
            status = 500
            return respond(500, outcome("exception", f"internal error ({type(e).__name__})"))
        finally:
            elapsed = time.perf_counter() - start
            requests_total.labels(operation, str(status)).inc()
            latency.labels(operation).observe(elapsed)
            access_log.info(json.dumps({"client": client_name, "operation": operation, "status": status,
                                        "bytes_in": size_in, "ms": round(elapsed * 1000, 1), "sha256": digest}))

    async def audited(request: Request, deid, data_format: str, raw: bytes, work):
        """Run `work`; write the audit record (durably) before anything is answered. No trail, no answer."""
        try:
            result, output = await work()
        except HttpError as e:
            if config.audit is not None and e.status in (422, 503):
                await run_audit(config.audit.record_refusal, deid, actor=request.state.client, channel="service",
                                data_format=data_format, input=raw, reason=e.diagnostics)
            raise
        if config.audit is not None:
            await run_audit(config.audit.record_deidentification, deid, actor=request.state.client, channel="service",
                            data_format=data_format, input=raw, output=output,
                            findings=getattr(result, "findings", ()))
        return result, output

    async def run_audit(fn, *args, **kwargs):
        try:
            await asyncio.get_running_loop().run_in_executor(pool, lambda: fn(*args, **kwargs))
        except AuditError as e:
            raise HttpError(503, "transient", f"audit trail unavailable: {e}") from None

    def map_errors(fn):
        def wrapped(*args):
            try:
                return fn(*args)
            except (InputError, RecordRefused) as e:
                status, code = next(v for kind, v in HTTP_STATUS.items() if isinstance(e, kind))
                raise HttpError(status, code, str(e)) from None
        return wrapped

    async def fhir_work(request: Request):
        raw = await body(request, JSON_TYPES)
        digest = hashlib.sha256(raw).hexdigest()
        try:
            doc = json_input.loads(raw)
        except json_input.JsonInputError as e:
            raise HttpError(400, "structure", str(e)) from None
        if not isinstance(doc, dict):
            raise HttpError(400, "structure", "the body must be a FHIR resource (a JSON object)")
        wrapped = doc.get("resourceType") == "Parameters"
        profile = stack = asked = None
        if wrapped:
            given = doc.get("parameter") or []
            if not isinstance(given, list):
                raise HttpError(400, "structure", "Parameters.parameter must be a list")
            named = [p.get("name") for p in given if isinstance(p, dict)]
            twice = sorted(n for n in OPERATION_PARAMETERS if named.count(n) > 1)
            if twice:  # which one counts would be a guess: the first, the last? Neither.
                raise HttpError(400, "invalid", f"parameter {twice[0]!r} given {named.count(twice[0])} times: give it once")
            params = {p.get("name"): p for p in given if isinstance(p, dict)}
            if "resource" not in params or not isinstance(params["resource"].get("resource"), dict):
                raise HttpError(400, "required", "Parameters needs a `resource` parameter holding a resource")
            resource = params["resource"]["resource"]
            profile = _param_value(params.get("profile"))
            stack = _param_value(params.get("stack"))
            asked = _param_value(params.get("fhirVersion"))
        else:
            resource = doc
        version = _fhir_version(request.headers.get("content-type", ""), asked) or config.fhir_version
        deid = engine(profile, stack)

        def deidentify(res: dict, path: str):
            return deid.deidentify(res, path, fhir_version=version)

        cost = admission.estimate_mb(len(raw), admission.text_chars(resource))

        async def work():
            result = await run(map_errors(deidentify), resource, "resource", cost_mb=cost)
            out = result.resource
            if wrapped:
                out = {"resourceType": "Parameters", "parameter": [{"name": "return", "resource": out}]}
                if deid.profile.safe_harbor_gaps:
                    out["parameter"].append({"name": "outcome", "resource": not_safe_harbor(deid.profile)})
            return result, json.dumps(out, ensure_ascii=False, allow_nan=False).encode()

        result, output = await audited(request, deid, "fhir", raw, work)
        for name, seconds in result.detector_seconds.items():
            detector_time.labels(name).observe(seconds)
        response = respond(200, output)
        response.headers["X-Deid-Safe-Harbor"] = "false" if deid.profile.safe_harbor_gaps else "true"
        return response, digest, len(raw)

    async def hl7_work(request: Request):
        raw = await body(request, HL7_TYPES)
        digest = hashlib.sha256(raw).hexdigest()
        deid = config.engines.get("hl7")
        if deid is None:
            try:
                deid = config.engines["hl7"] = HL7Deidentifier(
                    config.site.hl7 if config.site is not None else load_hl7_profile(config.profile),
                    Pseudonymizer(config.key), text_stack(config.stack, config.llm), config.clock,
                    charset=config.charset)
            except StackUnavailable as e:
                raise HttpError(503, "transient", str(e)) from None
        try:
            text = deid.read(raw).text  # as files and MLLP frames are read: never a replaced character
        except InputError as e:
            raise HttpError(*HTTP_STATUS[InputError], str(e)) from None

        charset = ""

        async def work():
            nonlocal charset
            result = await run(map_errors(deid.deidentify_file), text,
                               cost_mb=admission.estimate_mb(len(raw), len(text)))
            # written as the CLI and MLLP write: in the charset each MSH-18 names, which Content-Type names too
            data, charset = map_errors(er7.encode)(result.text), er7.content_charset(result.text)
            return result, data

        _, output = await audited(request, deid, "hl7v2", raw, work)
        media = "x-application/hl7-v2+er7" + (f"; charset={charset}" if charset else "")
        return respond(200, output, media), digest, len(raw)

    @app.post("/fhir/$de-identify")
    async def fhir_deidentify(request: Request):
        return await handle(request, "fhir", fhir_work)

    @app.post("/hl7v2/$de-identify")
    async def hl7_deidentify(request: Request):
        return await handle(request, "hl7v2", hl7_work)

    @app.get("/fhir/metadata")
    async def metadata(request: Request):
        async def work(_):
            return respond(200, json.loads((CONFORMANCE / "CapabilityStatement-deid-adapter.json").read_text())), "-", 0
        return await handle(request, "metadata", work)

    @app.get("/fhir/OperationDefinition/de-identify")
    async def operation_definition(request: Request):
        async def work(_):
            return respond(200, json.loads((CONFORMANCE / "OperationDefinition-de-identify.json").read_text())), "-", 0
        return await handle(request, "metadata", work)

    @app.get("/healthz")
    async def healthz():
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz(request: Request):
        async def work(_):
            engine(None, None)
            return respond(200, {"status": "ready", "profile": config.profile,
                                 "stack": engine(None, None).stack.name}, "application/json"), "-", 0
        return await handle(request, "ready", work)

    @app.get("/metrics")
    async def metrics(request: Request):
        async def work(_):
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST), "-", 0
        return await handle(request, "metrics", work)

    return app


def _param_value(param: dict | None) -> str | None:
    if not param:
        return None
    for key in ("valueCode", "valueString"):
        if isinstance(param.get(key), str):
            return param[key]
    raise HttpError(400, "invalid", f"parameter {param.get('name')!r} must be a code or string")


def _fhir_version(content_type: str, asked: str | None) -> str | None:
    """The FHIR version a request names: the `fhirVersion` parameter of its media type (FHIR's own way, e.g.
    `application/fhir+json; fhirVersion=5.0`) or of its Parameters (r4, r5, stu3, auto or a number); None if neither."""
    named = {}
    for part in content_type.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "fhirversion":
            version = versions.of_number(value.strip().strip('"'))
            if version is None:
                raise HttpError(415, "not-supported", "fhirVersion of the media type must be 3.0, 4.0, 4.3 or 5.0")
            named["media type"] = version
    if asked is not None:
        version = asked if asked in (*versions.FHIR_VERSIONS, versions.AUTO) else versions.of_number(asked)
        if version is None:
            raise HttpError(400, "invalid", "parameter 'fhirVersion' must be r4, r5, stu3, auto or a FHIR version number")
        named["parameter"] = version
    if len(set(named.values())) > 1:
        raise HttpError(400, "invalid", "the media type and the fhirVersion parameter name different FHIR versions")
    return next(iter(named.values()), None)


def _until(deadline: float, fn, *args):
    """fn(*args) with its text detectors stopping at `deadline`: a request past its time frees its worker and
    its memory."""
    with budget.until(deadline):
        try:
            return fn(*args)
        except Exception:
            if time.monotonic() < deadline:
                raise
    # Past the deadline the answer is a 503 already. Raised outside the except block, so that no traceback keeps
    # the work's frames (its texts, tokens, windows) alive; then the freed memory goes back to the system.
    _return_memory()
    raise HttpError(503, "timeout", "de-identification took longer than its deadline")


def _return_memory() -> None:
    """Collect, and hand freed heap pages back to the system (glibc keeps them otherwise)."""
    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)
