"""A review setup for tests: review key, queue, users, thresholds, engine, and a record the thresholds hold."""
from __future__ import annotations

import base64
import json
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from adapter.audit.trail import AuditTrail, database_url
from adapter.review.app import ReviewConfig
from adapter.review.auth import UserStore, add_user
from adapter.review.flow import route
from adapter.review.queue import ReviewQueue, Thresholds
from fhir_transforms import keys
from tests.conftest import make_engine

NOTE = "Seen on 03/14/2025 by Dr. Alvarez; call 617-555-0142. Lives with Quentin Marsh in Brookline."
THRESHOLDS = {"thresholds": {"DATE": 0.95, "PHONE_NUMBER": 0.95, "NAME": 0.85}, "default": 0.0}
PASSWORDS = {"rita": "rita-pass-1", "adam": "adam-pass-1", "otto": "otto-pass-1"}


def observation(note: str = NOTE, family: str = "") -> dict:
    res = {"resourceType": "Observation", "status": "final", "code": {"text": "Progress note"},
           "note": [{"text": note}]}
    if family:
        res["contained"] = [{"resourceType": "Patient", "id": "p1", "name": [{"family": family}]}]
        res["subject"] = {"reference": "#p1"}
    return res


@dataclass
class ReviewSetup:
    root: Path
    queue: ReviewQueue
    review_key: keys.Key
    trail: AuditTrail
    thresholds: Thresholds
    users_file: Path
    out_dir: Path
    engine: object

    def config(self) -> ReviewConfig:
        return ReviewConfig(self.queue, UserStore.load(self.users_file), self.engine, self.thresholds, self.out_dir,
                            self.trail)

    def hold(self, resource: dict | None = None, site: str = "north") -> str:
        routed = route(self.engine, resource or observation(), "Observation", self.thresholds, self.queue, site)
        assert routed.held
        return routed.held_id


def make_setup(root: Path, test_key, queue_url: str | None = None) -> ReviewSetup:
    root.mkdir(parents=True, exist_ok=True)
    keys.init_key_file(root / "review.key", "review")
    review_key = keys.load_key(root / "review.key", "review")
    audit_key = root / "audit.key"
    keys.init_key_file(audit_key, "audit")
    trail = AuditTrail(database_url(root / "audit.sqlite"), [keys.load_key(audit_key, "audit")])
    queue = ReviewQueue(queue_url or database_url(root / "review.sqlite"), review_key)
    users = root / "users.json"
    add_user(users, "rita", "reviewer", "north", PASSWORDS["rita"])
    add_user(users, "adam", "admin", "north", PASSWORDS["adam"])
    add_user(users, "otto", "reviewer", "south", PASSWORDS["otto"])
    out = root / "released"
    out.mkdir()
    return ReviewSetup(root, queue, review_key, trail, Thresholds.from_json(THRESHOLDS), users, out,
                       make_engine(test_key))


def secrets_of(setup: ReviewSetup, test_key) -> list[str]:
    """Every written form of the keys a page must never carry."""
    out = []
    for k in (setup.review_key, test_key):
        out += [base64.b64encode(k.secret).decode(), k.secret.hex()]
    return out


class LiveServer:
    """The review app on a free port of 127.0.0.1, in a thread (a real socket, for the browser)."""

    def __init__(self, app):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("review server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)


def released_text(setup: ReviewSetup, item_id: str) -> str:
    return json.loads((setup.out_dir / f"{item_id}.json").read_text())["note"][0]["text"]
