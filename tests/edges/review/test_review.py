"""Review of low-confidence spans: routing, the sealed queue (SQLite and PostgreSQL), decisions and release,
sign-in, roles, sites, CSRF, and the training export."""
from __future__ import annotations

import dataclasses
import json
import sqlite3
import stat
import threading
import uuid

import httpx
import pytest
from fastapi.testclient import TestClient

from adapter.review.app import create_review_app, review_reason
from adapter.review.auth import UsersFileError, UserStore, add_user, check_password, hash_password
from adapter.review.export import export_examples
from adapter.review.flow import MAX_DECISIONS, DecidedStack, DecisionError, decide, release, route
from adapter.review.queue import (
    QueueError,
    ReviewQueue,
    TextUnderReview,
    Thresholds,
    iter_sealed,
)
from adapter.review.sessions import LoginThrottle, Sessions
from fhir_transforms import keys
from fhir_transforms.errors import RecordRefused
from tests.support import (
    NOTE,
    PASSWORDS,
    THRESHOLDS,
    LiveServer,
    make_setup,
    observation,
    released_text,
    secrets_of,
)
from tests.conftest import write_key
from text_deid.spans import DetectorError


@pytest.fixture
def setup(tmp_path, test_key):
    return make_setup(tmp_path / "review", test_key)


def signed_in(setup, name: str) -> tuple[TestClient, str]:
    client = TestClient(create_review_app(setup.config()))
    page = client.get("/login").text
    csrf = page.split('name="csrf" value="')[1].split('"')[0]
    r = client.post("/login", data={"name": name, "password": PASSWORDS[name], "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303
    page = client.get("/").text
    return client, page.split('name="csrf-token" content="')[1].split('"')[0]


# --- routing


@pytest.mark.parametrize("table, held", [
    ({"DATE": 0.95}, True),           # the date (0.90) is below 0.95
    ({"DATE": 0.9, "PHONE_NUMBER": 0.85}, False),  # at the threshold is not below it
    ({}, False),                      # default 0: nothing is held
])
def test_a_record_is_held_when_a_span_is_below_its_threshold(setup, table, held):
    routed = route(setup.engine, observation(), "Observation", Thresholds.from_json({"thresholds": table}),
                   setup.queue, "north")
    assert routed.held is held
    assert len(setup.queue.rows("north")) == int(held)
    if not held:
        assert routed.result.resource["note"][0]["text"].startswith("Seen on [DATE]")


def test_thresholds_file_and_priority(tmp_path):
    path = tmp_path / "review.yaml"
    path.write_text("thresholds:\n  NAME: 0.85\n  DATE: 0.6\ndefault: 0.5\n")
    t = Thresholds.load(path)
    assert (t.threshold("NAME"), t.threshold("DATE"), t.threshold("URL")) == (0.85, 0.6, 0.5)
    path.write_text("thresholds: {NAMES: 0.8}\n")
    with pytest.raises(ValueError, match="unknown categories"):
        Thresholds.load(path)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Thresholds.from_json({"thresholds": {"NAME": 1.5}})


def test_queue_lists_the_least_certain_first(setup):
    low = setup.hold(observation("Seen 03/14/2025, 04/01/2025, 05/02/2025, 06/03/2025 and 07/04/2025."))
    high = setup.hold()
    assert [r.id for r in setup.queue.rows("north")] == [low, high]


# --- sealed at rest


def test_held_text_is_not_readable_in_the_database_without_the_review_key(setup, tmp_path):
    item = setup.hold(observation(family="Marsh"))
    raw = (setup.root / "review.sqlite").read_bytes() + b"".join(
        (setup.root / f"review.sqlite{s}").read_bytes() for s in ("-wal",) if (setup.root / f"review.sqlite{s}").exists())
    for secret in ("Alvarez", "Quentin", "617-555-0142", "03/14/2025", "Marsh"):
        assert secret.encode() not in raw
    row = sqlite3.connect(setup.root / "review.sqlite").execute("select * from deid_review_item").fetchone()
    assert not any("Alvarez" in str(v) for v in row)
    other = ReviewQueue(setup.queue.url, keys.load_key(keys.init_key_file(tmp_path / "other.key", "review") and
                                                       tmp_path / "other.key", "review"))
    with pytest.raises(QueueError, match="not the one given"):
        other.open(item, "north")
    assert ReviewQueue(setup.queue.url, setup.review_key).open(item, "north").texts[1].text == NOTE


def test_a_sealed_record_moved_to_another_site_does_not_open(setup):
    item = setup.hold()
    with setup.queue.engine.begin() as conn:
        conn.exec_driver_sql("update deid_review_item set site='south' where id=?", (item,))
    with pytest.raises(QueueError, match="does not decrypt"):
        setup.queue.open(item, "south")


def test_queue_on_postgresql(tmp_path, test_key):
    try:
        setup = make_setup(tmp_path / "pg", test_key, "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    except QueueError as e:
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 (db test) is needed: {e}")
    site = f"pg-{uuid.uuid4().hex[:8]}"
    item = setup.hold(site=site)
    held = setup.queue.open(item, site)
    decisions = decide(held, [], setup.thresholds)
    assert "[DATE]" in release(setup.engine, held, decisions).resource["note"][0]["text"]
    assert setup.queue.close_item(item, site, "released", "rita", [d.to_json() for d in decisions])
    assert not setup.queue.close_item(item, site, "released", "rita", [])  # never twice
    sessions = Sessions(setup.queue.engine)  # sessions live beside the queue, on PostgreSQL too
    cookie, csrf = sessions.start("rita")
    assert sessions.read(cookie) == ("rita", csrf)
    sessions.end(cookie)
    assert sessions.read(cookie) is None


# --- decisions


def test_undecided_spans_are_confirmed_and_bad_decisions_refused(setup):
    held = setup.queue.open(setup.hold(), "north")
    assert [d.action for d in decide(held, [], setup.thresholds)] == ["confirm", "confirm"]
    with pytest.raises(DecisionError):
        decide(held, [{"text": 1, "start": 5, "end": 999, "category": "NAME", "action": "add"}], setup.thresholds)
    with pytest.raises(DecisionError):
        decide(held, [{"text": 1, "origin": 0, "category": "NOT_A_CATEGORY", "action": "change"}], setup.thresholds)
    changed = decide(held, [{"text": 1, "origin": 1, "category": "FAX_NUMBER", "action": "change"}], setup.thresholds)
    assert "[FAX_NUMBER]" in release(setup.engine, held, changed).resource["note"][0]["text"]


def test_the_leak_guard_refuses_a_release_that_rejects_a_known_identifier(setup):
    held = setup.queue.open(setup.hold(observation(NOTE.replace("Quentin Marsh", "Quentin Marshfield") + " Marshfield",
                                                   family="Marshfield")), "north")
    last = len(held.texts) - 1
    known = [(s.start, s.end) for s in held.texts[last].spans if s.detector == "known"]
    assert known
    # decide() refuses to reject a confident span; the leak guard still stands behind it
    rejected = [dataclasses.replace(d, action="reject") if d.text == last and (d.start, d.end) in known else d
                for d in decide(held, [], setup.thresholds)]
    with pytest.raises(RecordRefused, match="leak guard"):
        release(setup.engine, held, rejected)


def test_a_confident_span_cannot_be_rejected(setup):
    """Issue #17 item 6: only spans routed for review (below their threshold) may be rejected; a confident SSN
    (0.90, threshold 0) is refused with 400 and never released in the clear."""
    item = setup.hold(observation("SSN 123-45-6789; call 617-555-0142 on 03/14/2025."))
    held = setup.queue.open(item, "north")
    ssn = next(i for i, s in enumerate(held.texts[1].spans) if s.category == "SOCIAL_SECURITY_NUMBER")
    phone = next(i for i, s in enumerate(held.texts[1].spans) if s.category == "PHONE_NUMBER")
    client, csrf = signed_in(setup, "rita")
    r = client.post(f"/records/{item}/release", json={"decisions": [{"text": 1, "origin": ssn, "action": "reject"}]},
                    headers={"x-csrf-token": csrf})
    assert r.status_code == 400 and "not routed for review" in r.json()["error"]
    assert "123-45-6789" not in r.text
    assert not (setup.out_dir / f"{item}.json").exists() and setup.queue.row(item).status == "held"
    # the routed phone (0.85 < 0.95) may be rejected; the SSN is masked whatever the page sends
    r = client.post(f"/records/{item}/release", json={"decisions": [{"text": 1, "origin": phone, "action": "reject"}]},
                    headers={"x-csrf-token": csrf})
    assert r.status_code == 200, r.text
    assert released_text(setup, item) == "SSN [SOCIAL_SECURITY_NUMBER]; call 617-555-0142 on [DATE]."


# --- sign-in, roles, sites, CSRF


def test_passwords_are_scrypt_hashed_and_the_users_file_must_be_private(setup):
    stored = hash_password("s3cret")
    assert stored.startswith("scrypt$") and "s3cret" not in stored
    assert check_password("s3cret", stored) and not check_password("S3cret", stored)
    assert "rita-pass-1" not in setup.users_file.read_text()
    assert stat.S_IMODE(setup.users_file.stat().st_mode) == 0o600
    store = UserStore.load(setup.users_file)
    assert store.authenticate("rita", "wrong") is None and store.authenticate("nobody", "x") is None
    setup.users_file.chmod(0o644)
    with pytest.raises(UsersFileError, match="chmod 600"):
        UserStore.load(setup.users_file)


def test_no_access_without_sign_in(setup):
    item = setup.hold()
    client = TestClient(create_review_app(setup.config()))
    r = client.get("/", headers={"accept": "text/html"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert client.get(f"/records/{item}").status_code == 401
    assert client.post(f"/records/{item}/release", json={"decisions": []}).status_code == 401
    assert client.get("/admin").status_code == 401
    client.cookies.set("deid_review_session", "forged")
    assert client.get("/").status_code == 401


def test_sign_in_needs_the_form_csrf_token_and_the_right_password(setup):
    client = TestClient(create_review_app(setup.config()))
    client.get("/login")
    assert client.post("/login", data={"name": "rita", "password": PASSWORDS["rita"]}).status_code == 403
    page = client.get("/login").text
    csrf = page.split('name="csrf" value="')[1].split('"')[0]
    assert client.post("/login", data={"name": "rita", "password": "nope", "csrf": csrf}).status_code == 401


def test_sign_out_ends_the_session_on_the_server(setup):
    """Issue #17 item 13: a signed-out cookie opens nothing (it did for up to 8 h); the store keeps only a digest."""
    item = setup.hold()
    client, csrf = signed_in(setup, "rita")
    cookie = client.cookies.get("deid_review_session")
    assert client.get(f"/records/{item}").status_code == 200
    assert client.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    replay = TestClient(client.app)
    replay.cookies.set("deid_review_session", cookie)
    assert replay.get(f"/records/{item}").status_code == 401
    assert replay.get("/", headers={"accept": "text/html"}, follow_redirects=False).headers["location"] == "/login"
    live = signed_in(setup, "rita")[0].cookies.get("deid_review_session")
    rows = sqlite3.connect(setup.root / "review.sqlite").execute("select * from deid_review_session").fetchall()
    assert len(rows) == 1 and live not in str(rows)  # only the live session, by its digest
    now = [0.0]
    sessions = Sessions(setup.queue.engine, max_age_s=60, clock=lambda: now[0])
    cookie, _ = sessions.start("rita")
    now[0] = 61.0
    assert sessions.read(cookie) is None  # expired


def _attempt(client: TestClient, name: str, password: str):
    page = client.get("/login").text
    csrf = page.split('name="csrf" value="')[1].split('"')[0]
    return client.post("/login", data={"name": name, "password": password, "csrf": csrf}, follow_redirects=False)


def test_sign_in_is_throttled_per_name_and_per_address(setup):
    """Issue #17 item 13: failed sign-ins lock the name, then the client address, for a while (injected clock)."""
    now = [1000.0]
    config = setup.config()
    config.throttle = LoginThrottle(max_per_user=3, max_per_address=5, window_s=60, lockout_s=300,
                                    clock=lambda: now[0])
    client = TestClient(create_review_app(config))
    assert [_attempt(client, "rita", "wrong").status_code for _ in range(3)] == [401, 401, 401]
    locked = _attempt(client, "rita", PASSWORDS["rita"])  # the right password, but locked
    assert locked.status_code == 429 and "Too many failed sign-ins" in locked.text
    assert 0 < int(locked.headers["retry-after"]) <= 301
    now[0] += 301
    assert _attempt(client, "rita", PASSWORDS["rita"]).status_code == 303
    # a successful sign-in clears the name's count
    now[0] += 61
    assert [_attempt(client, "adam", "wrong").status_code for _ in range(2)] == [401, 401]
    assert _attempt(client, "adam", PASSWORDS["adam"]).status_code == 303
    now[0] += 61
    assert [_attempt(client, "adam", "wrong").status_code for _ in range(2)] == [401, 401]
    assert _attempt(client, "adam", PASSWORDS["adam"]).status_code == 303
    # many names from one address lock the address
    now[0] += 61
    assert [_attempt(client, f"guess{i}", "wrong").status_code for i in range(5)] == [401] * 5
    assert _attempt(client, "otto", PASSWORDS["otto"]).status_code == 429


def test_password_hashing_leaves_the_event_loop_free(setup):
    """Issue #17 item 13: while a sign-in hashes (held here until the other request is answered), the server still
    answers another request; with scrypt on the event loop the other request waited for the hash."""
    hashing, answered, order = threading.Event(), threading.Event(), []

    class SlowUsers(UserStore):
        def authenticate(self, name, password):
            hashing.set()
            answered.wait(10)
            order.append("hashed")
            return super().authenticate(name, password)

    config = setup.config()
    config.users = SlowUsers.load(setup.users_file)
    with LiveServer(create_review_app(config)) as srv, httpx.Client(base_url=srv.url) as client:
        csrf = client.get("/login").text.split('name="csrf" value="')[1].split('"')[0]
        login = threading.Thread(target=lambda: order.append(client.post(
            "/login", data={"name": "rita", "password": PASSWORDS["rita"], "csrf": csrf}).status_code))
        login.start()
        assert hashing.wait(10)
        assert httpx.get(srv.url + "/healthz", timeout=30).status_code == 200
        order.append("healthz")
        answered.set()
        login.join(30)
    assert order == ["healthz", "hashed", 303]  # then the sign-in went through


def test_release_needs_the_csrf_token(setup):
    item = setup.hold()
    client, csrf = signed_in(setup, "rita")
    assert client.post(f"/records/{item}/release", json={"decisions": []}).status_code == 403
    assert client.post(f"/records/{item}/release", json={"decisions": []},
                       headers={"x-csrf-token": "x" + csrf[1:]}).status_code == 403
    r = client.post(f"/records/{item}/release", json={"decisions": []}, headers={"x-csrf-token": csrf})
    assert r.status_code == 200 and r.json()["status"] == "released"
    assert released_text(setup, item).startswith("Seen on [DATE] by Dr. Alvarez; call [PHONE_NUMBER].")
    again = client.post(f"/records/{item}/release", json={"decisions": []}, headers={"x-csrf-token": csrf})
    assert again.status_code == 409


def test_a_reviewer_cannot_act_as_admin(setup):
    item = setup.hold()
    client, csrf = signed_in(setup, "rita")
    assert client.get("/admin").status_code == 403
    assert client.post(f"/admin/records/{item}/discard", data={"csrf": csrf}).status_code == 403
    admin, admin_csrf = signed_in(setup, "adam")
    assert admin.get("/admin").status_code == 200
    assert admin.post(f"/admin/records/{item}/discard", data={"csrf": admin_csrf, "reason": "duplicate"},
                      follow_redirects=False).status_code == 303
    assert setup.queue.row(item).status == "discarded"
    assert [r["detail"]["decision"] for r in setup.trail.export(operations=["review"])] == ["discard"]


def test_a_reviewer_sees_no_other_sites_data_and_no_key(setup, test_key):
    south = setup.hold(observation(NOTE.replace("Alvarez", "Southwood")), site="south")
    north = setup.hold()
    client, csrf = signed_in(setup, "rita")
    listing = client.get("/").text
    assert north in listing and south not in listing
    assert client.get(f"/records/{south}").status_code == 404
    assert client.post(f"/records/{south}/release", json={"decisions": []},
                       headers={"x-csrf-token": csrf}).status_code == 404
    page = client.get(f"/records/{north}").text
    assert "Alvarez" in page and "Southwood" not in page
    for text in (listing, page, client.get("/static/review.js").text):
        assert all(s not in text for s in secrets_of(setup, test_key))
        assert setup.review_key.key_id not in text
    assert client.get(f"/records/{north}").headers["cache-control"] == "no-store"


# --- training export


def test_export_keeps_text_sealed_without_the_review_key(setup, tmp_path):
    item = setup.hold()
    client, csrf = signed_in(setup, "rita")
    start = NOTE.index("Quentin")
    decisions = [{"text": 1, "origin": 1, "action": "reject"},
                 {"text": 1, "start": start, "end": start + 13, "category": "NAME", "action": "add"}]
    assert client.post(f"/records/{item}/release", json={"decisions": decisions},
                       headers={"x-csrf-token": csrf}).status_code == 200
    sealed_out, plain_out = tmp_path / "sealed.jsonl", tmp_path / "plain.jsonl"
    assert export_examples(iter_sealed(ReviewQueue(setup.queue.url, None), "north"), None, sealed_out) == 1
    assert "Quentin" not in sealed_out.read_text() and "text" not in json.loads(sealed_out.read_text())
    assert export_examples(iter_sealed(setup.queue, "north"), setup.queue, plain_out) == 1
    example = json.loads(plain_out.read_text())
    assert example["text"] == NOTE
    assert example["spans"] == [{"start": 8, "end": 18, "category": "DATE"},
                                {"start": start, "end": start + 13, "category": "NAME"}]
    assert stat.S_IMODE(plain_out.stat().st_mode) == 0o600


def test_a_held_record_whose_keys_are_not_sorted_is_released(setup):
    """Issue #17 item 13: the queue stores the record with sorted keys; the release matches texts by path, so a
    Condition whose `text` precedes `code` is released (it was refused: the texts came in another order)."""
    condition = {"resourceType": "Condition",
                 "text": {"status": "generated",
                          "div": '<div xmlns="http://www.w3.org/1999/xhtml">Seen on 03/14/2025 by Dr. Alvarez.</div>'},
                 "code": {"text": "Asthma; call 617-555-0142"},
                 "subject": {"reference": "Patient/p1"}}
    item = setup.hold(condition)
    client, csrf = signed_in(setup, "rita")
    page = client.get(f"/records/{item}").text
    assert "text.div" in page and "code.text" in page  # each text is shown with its path
    r = client.post(f"/records/{item}/release", json={"decisions": []}, headers={"x-csrf-token": csrf})
    assert r.status_code == 200, r.text
    released = json.loads((setup.out_dir / f"{item}.json").read_text())
    assert released["code"]["text"] == "Asthma; call [PHONE_NUMBER]"
    assert "[DATE]" in released["text"]["div"] and "03/14/2025" not in released["text"]["div"]


def test_a_record_held_before_texts_had_paths_is_matched_in_order(setup):
    """Rows held by an earlier release name a path only for texts with findings: those compare in order."""
    held = setup.queue.open(setup.hold(), "north")
    old = [TextUnderReview(t.path if t.spans else "", t.text, t.spans) for t in held.texts]
    held = dataclasses.replace(held, texts=old)
    assert "[DATE]" in release(setup.engine, held, decide(held, [], setup.thresholds)).resource["note"][0]["text"]
    stack = DecidedStack(setup.engine.stack, old, [[] for _ in old], None)
    with pytest.raises(DetectorError, match="differ"):
        stack.detect_many([t.text for t in reversed(old)], ())


# Issue #36, the smaller items of the review page.

def test_a_name_locked_by_someone_else_still_opens_to_its_owner(setup):
    now = [1000.0]
    config = setup.config()
    config.throttle = LoginThrottle(max_per_user=3, max_per_address=50, window_s=60, lockout_s=900, clock=lambda: now[0])
    app = create_review_app(config)
    attacker = TestClient(app, client=("10.9.9.66", 4000))
    assert [_attempt(attacker, "rita", "wrong").status_code for _ in range(3)] == [401, 401, 401]
    assert _attempt(attacker, "rita", PASSWORDS["rita"]).status_code == 429  # locked where it failed
    owner = TestClient(app, client=("10.0.0.7", 5000))
    assert _attempt(owner, "rita", PASSWORDS["rita"]).status_code == 303  # not where it did not
    other = TestClient(app, client=("10.9.9.67", 4001))
    assert _attempt(other, "rita", "wrong").status_code == 401
    assert _attempt(other, "rita", PASSWORDS["rita"]).status_code == 429  # a locked name's next failure locks at once


def test_short_passwords_are_refused(tmp_path):
    with pytest.raises(UsersFileError, match="at least 8"):
        add_user(tmp_path / "users.json", "tina", "reviewer", "north", "x")


def test_a_discard_reason_is_kept_only_from_the_list_else_hashed(setup):
    assert review_reason("Duplicate") == "duplicate"
    said = "patient Zyxwortel asked to be left out"
    kept = review_reason(said)
    assert kept.startswith("other sha256:") and "Zyxwortel" not in kept
    admin, csrf = signed_in(setup, "adam")
    assert admin.post(f"/admin/records/{setup.hold()}/discard", data={"csrf": csrf, "reason": said},
                      follow_redirects=False).status_code == 303
    assert [r["detail"]["reason"] for r in setup.trail.export(operations=["review"])] == [kept]


def test_decisions_are_deduplicated_capped_and_never_echoed(setup):
    held = setup.queue.open(setup.hold(), "north")
    add = {"text": 1, "start": 0, "end": 4, "category": "NAME", "action": "add"}
    decided = decide(held, [add] * 500, setup.thresholds)
    assert sum(d.action == "add" for d in decided) == 1
    with pytest.raises(DecisionError, match="more than"):
        decide(held, [add] * (MAX_DECISIONS + 1), setup.thresholds)
    with pytest.raises(DecisionError) as e:
        decide(held, [{"text": 1, "origin": 0, "category": "Zyxwortel", "action": "change"}], setup.thresholds)
    assert "Zyxwortel" not in str(e.value)


def test_review_serve_trusts_forwarded_headers_only_from_a_named_proxy(monkeypatch, setup):
    from typer.testing import CliRunner
    from adapter.cli import review as review_command
    from adapter.cli.main import app as cli_app

    served = []

    def serve_app(app, sock, ssl_certfile, ssl_keyfile, about, **kw):
        sock.close()
        served.append((app, kw))

    monkeypatch.setattr(review_command, "serve_app", serve_app)
    (setup.root / "thresholds.json").write_text(json.dumps(THRESHOLDS))
    write_key(setup.root / "site.key", bytes(range(32)))
    args = ["review", "serve", "--users", str(setup.users_file), "--out", str(setup.out_dir), "--config",
            str(setup.root / "thresholds.json"), "--queue", setup.queue.url, "--review-key-file",
            str(setup.root / "review.key"), "--key-file", str(setup.root / "site.key"), "--stack", "patterns",
            "--port", "0"]
    for extra, behind_proxy in (([], False), (["--trusted-proxy", "10.0.0.1", "--behind-tls"], True)):
        result = CliRunner().invoke(cli_app, args + extra)
        assert result.exit_code == 0, result.output
        app, settings = served[-1]
        assert settings["proxy_headers"] is behind_proxy
        assert settings["forwarded_allow_ips"] == ("10.0.0.1" if behind_proxy else "")
        cookie = TestClient(app).get("/login").headers["set-cookie"]
        assert ("secure" in cookie.lower()) is behind_proxy
