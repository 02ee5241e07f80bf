"""`deid-adapter review …`: a review-enabled FHIR run, the review page, reviewer accounts, the training export and
fine-tuning the NER from the decisions. Registered at the bottom of adapter/cli/main.py."""
from __future__ import annotations

import getpass
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from adapter import files as fhir_files
from adapter.audit import trail as audit
from adapter.cli import auditing
from adapter.cli.common import fail, host_text, listening_socket, serve_app
from adapter.engines import fhir_engine
from adapter.review.app import ReviewConfig, create_review_app
from adapter.review.auth import ROLES, USERS_ENV, UsersFileError, UserStore, add_user
from adapter.review.export import export_examples
from adapter.review.flow import route
from adapter.review.queue import (
    REVIEW_KEY_ENV,
    QueueError,
    ReviewQueue,
    Thresholds,
    iter_sealed,
    queue_url,
)
from adapter.review.training import fine_tune, load_examples
from fhir_transforms import keys
from fhir_transforms.errors import InputError, RecordRefused

review_app = typer.Typer(help="Human review of low-confidence spans: hold, review in a browser, export, retrain.",
                         no_args_is_help=True)

QueueOpt = typer.Option(None, "--queue", envvar="DEID_ADAPTER_REVIEW_QUEUE", show_envvar=True,
                        help="Review queue: a SQLAlchemy URL (postgresql://…) or a SQLite path. "
                             "Default ~/.local/state/deid-adapter/review.sqlite.")
ReviewKeyOpt = typer.Option(None, "--review-key-file", envvar=REVIEW_KEY_ENV, show_envvar=True,
                            help="Review key (`keys init --purpose review PATH`): seals the held text.")
ConfigOpt = typer.Option(..., "--config", help="Review config (YAML/JSON): {thresholds: {NAME: 0.85, DATE: 0.6}, default: 0}.")
SiteOpt = typer.Option(..., "--site", help="The site whose records these are; reviewers see only their own site.")


def _queue(target: Optional[str], key_file: Optional[Path], need_key: bool = True) -> ReviewQueue:
    try:
        key = keys.load_key(key_file, "review") if (key_file or need_key) else None
        return ReviewQueue(queue_url(target), key)
    except (keys.KeyError_, QueueError) as e:
        fail(str(e))


def _thresholds(path: Path) -> Thresholds:
    try:
        return Thresholds.load(path)
    except ValueError as e:
        fail(str(e))


def review_fhir(
    input: Path = typer.Argument(..., help="A Bundle or resource .json, an .ndjson file, or a folder of those."),
    output: Path = typer.Argument(..., help="Where records that need no review are written; mirrors INPUT."),
    config: Path = ConfigOpt,
    site: str = SiteOpt,
    queue: Optional[str] = QueueOpt,
    review_key_file: Optional[Path] = ReviewKeyOpt,
    profile: str = typer.Option("safe-harbor", "--profile"),
    stack: Optional[str] = typer.Option(None, "--stack"),
    key_file: Optional[Path] = typer.Option(None, "--key-file", envvar=keys.KEY_FILE_ENV),
    today: Optional[str] = typer.Option(None, "--today", help="Reference day for ages (YYYY-MM-DD)."),
    audit_target: Optional[str] = auditing.AuditOpt,
    audit_key_file: Optional[Path] = auditing.AuditKeyOpt,
    actor: Optional[str] = auditing.ActorOpt,
) -> None:
    """A review-enabled FHIR run: records with a span below its category's threshold are held in the review queue
    (sealed with the review key); the others are written to OUTPUT. Exit 3 when a record was refused."""
    thresholds = _thresholds(config)
    engine = fhir_engine(key_file, profile, stack, True, today)
    held_queue = _queue(queue, review_key_file)
    account = auditing.open_session(engine, "fhir", audit_target, audit_key_file, actor)
    try:
        inputs = fhir_files.list_inputs(input)
    except InputError as e:
        fail(str(e))
    counts = {"released": 0, "held": 0, "refused": 0, "bad_input": 0}
    for path, rel in inputs:
        target = (output / rel.name if output.is_dir() else output) if input.is_file() else output / rel
        try:
            f = fhir_files.read(path, rel)
            released, audited, held_entries = [], [], []
            for n, res in enumerate(f.resources, 1):
                where = f"{path}: line {n}" if f.ndjson else str(path)
                routed = route(engine, res, where, thresholds, held_queue, site)
                if routed.held:
                    counts["held"] += 1
                    held_entries.append(audit.AuditEntry(
                        "review", account.actor, "cli", "fhir", audit.sha256_of(res),
                        findings=audit.locations(routed.result.findings, where, res.get("resourceType", "")),
                        detail={"decision": "hold", "review_item": routed.held_id, "site": site}, **account.info))
                    typer.echo(f"held  {rel} line {n}: review item {routed.held_id}", err=True)
                else:
                    released.append(routed.result.resource)
                    audited.append((res, res["resourceType"], routed.result.findings, where))  # as the release hashes it
            account.pending.extend(held_entries)
            if released:
                data = fhir_files.serialize(released, f.ndjson)
                auditing.record_file(account, audited, data, f.ndjson)
                fhir_files.write_atomic(target, data)
                counts["released"] += len(released)
            else:
                account.commit()
        except (fhir_files.NoResources, InputError) as e:
            account.discard()
            counts["bad_input"] += 1
            typer.echo(f"bad input  {e}", err=True)
        except RecordRefused as e:
            account.discard()
            counts["refused"] += 1
            typer.echo(f"refused  {e}", err=True)
        except (QueueError, audit.AuditError) as e:
            fail(str(e))
    typer.echo(f"{counts['released']} released to {output}, {counts['held']} held for review, "
               f"{counts['refused']} refused, {counts['bad_input']} bad input", err=True)
    if counts["refused"]:
        raise typer.Exit(3)
    if counts["bad_input"]:
        raise typer.Exit(2)


def review_serve(
    users: Path = typer.Option(..., "--users", envvar=USERS_ENV, help="Users file (`review add-user`)."),
    config: Path = ConfigOpt,
    out: Path = typer.Option(..., "--out", help="Folder the released records are written to (ID.json)."),
    queue: Optional[str] = QueueOpt,
    review_key_file: Optional[Path] = ReviewKeyOpt,
    key_file: Optional[Path] = typer.Option(None, "--key-file", envvar=keys.KEY_FILE_ENV),
    profile: str = typer.Option("safe-harbor", "--profile"),
    stack: Optional[str] = typer.Option(None, "--stack"),
    today: Optional[str] = typer.Option(None, "--today", help="Reference day for ages (YYYY-MM-DD)."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8090, "--port"),
    ssl_certfile: Optional[Path] = typer.Option(None, "--ssl-certfile"),
    ssl_keyfile: Optional[Path] = typer.Option(None, "--ssl-keyfile"),
    behind_tls: bool = typer.Option(False, "--behind-tls", help="A TLS proxy serves the page: cookies are Secure."),
    trusted_proxy: Optional[str] = typer.Option(
        None, "--trusted-proxy", help="The proxy's address(es), comma-separated: only its X-Forwarded-For names the "
                                      "client (for the sign-in throttle); without it the header is ignored."),
    audit_target: Optional[str] = auditing.AuditOpt,
    audit_key_file: Optional[Path] = auditing.AuditKeyOpt,
) -> None:
    """Serve the review page: sign in, held records by priority, one record at a time, release with decisions."""
    try:
        store = UserStore.load(users)
    except UsersFileError as e:
        fail(str(e))
    sock = listening_socket(host, port)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    app = create_review_app(ReviewConfig(
        _queue(queue, review_key_file), store, fhir_engine(key_file, profile, stack, True, today),
        _thresholds(config), out, auditing.open_trail(audit_target, audit_key_file),
        secure_cookies=bool(ssl_certfile) or behind_tls))
    bound = sock.getsockname()
    # uvicorn trusts X-Forwarded-For from 127.0.0.1 by default: a client could rotate it past the throttle
    serve_app(app, sock, ssl_certfile, ssl_keyfile,
              f"review page on http{'s' * bool(ssl_certfile)}://{host_text(bound[0])}:{bound[1]}/",
              proxy_headers=bool(trusted_proxy), forwarded_allow_ips=trusted_proxy or "")


def review_add_user(users: Path = typer.Argument(..., help="Users file (created 0600)."),
                    name: str = typer.Option(..., "--name"),
                    role: str = typer.Option("reviewer", "--role", help=f"One of: {', '.join(ROLES)}."),
                    site: str = typer.Option(..., "--site")) -> None:
    """Add or replace a reviewer; the password is read from stdin (or prompted) and only its scrypt hash is kept."""
    password = getpass.getpass("Password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if sys.stdin.isatty() and getpass.getpass("Again: ") != password:
        fail("the passwords differ")
    try:
        add_user(users, name, role, site, password)
    except UsersFileError as e:
        fail(str(e))
    typer.echo(f"user {name} ({role}, site {site}) written to {users}", err=True)


def review_export(out: Path = typer.Option(..., "--out", help="Training examples (JSONL), written 0600."),
                  queue: Optional[str] = QueueOpt,
                  site: Optional[str] = typer.Option(None, "--site", help="Only this site's decisions."),
                  review_key_file: Optional[Path] = typer.Option(
                      None, "--review-key-file", help="Decrypt the text into OUT (a site-local path). "
                                                      "Without it the text stays sealed.")) -> None:
    """Released records' decisions as labeled training examples: {id, text | sealed, spans: [{start, end, category}]}."""
    if "://" in str(out):
        fail("--out must be a local path")
    held_queue = _queue(queue, review_key_file, need_key=False)
    try:
        n = export_examples(iter_sealed(held_queue, site), held_queue if review_key_file else None, out)
    except (QueueError, OSError) as e:
        fail(str(e))
    typer.echo(f"{n} example(s) written to {out} ({'text decrypted' if review_key_file else 'text sealed'})", err=True)


def review_train(from_review: Path = typer.Option(..., "--from-review", help="Examples from `review export` "
                                                                             "(with the text decrypted)."),
                 out: Path = typer.Option(..., "--out", help="Folder for the fine-tuned model."),
                 base: Optional[Path] = typer.Option(None, "--base", help="Model to start from (default: the "
                                                                          "project's NER model)."),
                 synthetic: int = typer.Option(400, "--synthetic", help="Synthetic training documents mixed in."),
                 steps: int = typer.Option(150, "--steps"),
                 seed: int = typer.Option(13, "--seed")) -> None:
    """Fine-tune the NER on the review decisions plus synthetic notes (DEID_ADAPTER_NER_MODEL=OUT to use it)."""
    try:
        examples = load_examples(from_review)
    except ValueError as e:
        fail(str(e))
    report = fine_tune(examples, out, base=base, synthetic=synthetic, steps=steps, seed=seed)
    typer.echo(json.dumps(report))


review_app.command("fhir")(review_fhir)
review_app.command("serve")(review_serve)
review_app.command("add-user")(review_add_user)
review_app.command("export")(review_export)
review_app.command("train")(review_train)
