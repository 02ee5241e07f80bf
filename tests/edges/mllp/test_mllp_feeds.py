"""The MLLP listener with the real engine: a channel's charset for messages without MSH-18, findings in the audit."""
from __future__ import annotations

import json

from adapter.audit.trail import AuditTrail
from adapter.cli.mllp import _audit_hook
from adapter.mllp import listener as mllp
from fhir_transforms.hl7v2.engine import HL7Deidentifier
from fhir_transforms.keys import init_key_file
from fhir_transforms.pseudonym import Pseudonymizer
from tests.edges.mllp.test_mllp_listener import HOST, IdempotentReceiver, MllpSender, run, running_service, wait_for
from text_deid.stack import build_stack

NOTE = "NTE|1||Jürgen Müller called back\r"


def adt(control_id: str) -> str:
    return (f"MSH|^~\\&|ADMIT|NORTH|EHR|SOUTH|20240101120000||ADT^A01^ADT_A01|{control_id}|P|2.5.1\r"
            f"PID|1||4455667^^^NORTH^MR||Müller^Jürgen||19700101|M\r" + NOTE)


def exchange(tmp_path, engine, trail=None, **kw) -> tuple[list[str], IdempotentReceiver]:
    audit = _audit_hook(trail, engine) if trail is not None else None

    async def scenario():
        receiver = await IdempotentReceiver().start()
        async with running_service(tmp_path / "q.sqlite", mllp.MllpTarget(HOST, receiver.port),
                                   deidentify=engine.deidentify_with_findings, audit=audit, **kw) as port:
            s = MllpSender(port)
            codes = [await s.send(adt("C-1"), "latin-1")]
            if codes == ["AA"]:
                await wait_for(lambda: len(receiver.order) == 1)
            await s.close()
        await receiver.stop()
        return codes, receiver

    return run(scenario())


def engine(test_key) -> HL7Deidentifier:
    return HL7Deidentifier.from_names("safe-harbor", Pseudonymizer(test_key), build_stack("patterns"))


def test_latin1_without_msh18_is_read_in_the_channel_charset(tmp_path, test_key):
    codes, _ = exchange(tmp_path / "none", engine(test_key))
    assert codes == ["AR"]  # not UTF-8, and nothing names another charset
    codes, receiver = exchange(tmp_path / "latin1", engine(test_key), charset="latin-1")
    assert codes == ["AA"]
    body = receiver.messages[receiver.order[0]].decode("utf-8")
    assert "Müller" not in body and "Jürgen" not in body


def test_an_audited_message_lists_its_findings(tmp_path, test_key):
    init_key_file(tmp_path / "audit.key", "audit")
    trail = AuditTrail.open(tmp_path / "audit.sqlite", tmp_path / "audit.key")
    codes, _ = exchange(tmp_path, engine(test_key), trail, charset="latin-1")
    assert codes == ["AA"]
    records = list(trail.export())
    (record,) = records
    assert record["channel"] == "mllp" and record["data_format"] == "hl7v2"
    assert ("NTE[3]-3", "NAME") in {(f["path"], f["category"]) for f in record["findings"]}
    assert "Müller" not in json.dumps(records, ensure_ascii=False)
