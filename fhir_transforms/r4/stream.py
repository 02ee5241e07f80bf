"""De-identify a large Bundle entry by entry, without holding it whole: the same output as
Deidentifier.deidentify of the whole Bundle (validation off), written one entry at a time.

What one entry's output depends on is known only once every entry has been read: the identifiers found
anywhere in the Bundle mask every entry's text, the reference targets and 90+ patients of the whole Bundle
rule each entry's references and dates, and the entry rules remove references to entries further on. So
the entries are read three times (`entries()` parses them anew each time; each is dropped after use):

1. what the record's resources are: entries removed by the rules, reference targets, patients and their
   age limits, the people's known identifiers (small, next to the entries);
2. the walk of each entry on its own, only for the identifiers the rule methods find (dates, ids, references);
3. the walk again, text replaced, labels stamped, the leak guard, and the entry handed to `emit`.

The Bundle's own labels collect what changed in any entry, so its meta is stamped last: the caller writes
the Bundle's other elements after the entries (fhir_transforms keeps JSON key order: see `adapter/files.py`).
"""
from __future__ import annotations

from collections import Counter
from itertools import chain
from typing import Callable, Iterable, Iterator, Mapping

from fhir_transforms import known as known_ids
from fhir_transforms.r4 import references, versions
from fhir_transforms.r4.entries import clean_entry, removed
from fhir_transforms.r4.methods import REMOVE
from fhir_transforms.r4.record import (Deidentifier, Finding, RecordResult, _copy, _known_order, guard, iter_resources,
                                       output_texts)
from fhir_transforms.r4.walker import (RecordContext, age_limit, entries_walked_alone, stamp_all,
                                       walk_entry, walk_resource)
from text_deid import leak_guard
from text_deid.spans import KnownIdentifier

# Entries walked and sent through the text stack and the leak guard together. A call costs in proportion to its
# texts, not to the Bundle's known identifiers (the matcher's automaton finds which of them a text can hold), so a
# fixed size keeps the batch's share of memory the same whatever the Bundle's size.
BATCH = 256


def streamable(engine: Deidentifier, header: dict) -> bool:
    """Whether a Bundle can take this path: validation off, and entries the profile walks one by one."""
    if engine.validate or header.get("resourceType") != "Bundle" or "entry" in header:
        return False
    version = engine.fhir_version if engine.fhir_version != versions.AUTO else versions.DEFAULT
    return entries_walked_alone(engine.profile.for_version(version))


def deidentify_entries(engine: Deidentifier, header: dict, before: list[str], entries: Callable[[], Iterator[object]],
                       emit: Callable[[object], None], path: str = "", linked: Iterable[KnownIdentifier] = (),
                       linked_age_limits: Mapping[str, int] | None = None) -> tuple[RecordResult, list[str]]:
    """The Bundle `header` (the Bundle without its `entry`) de-identified in place, each output entry handed to
    `emit` in order; InputError / RecordRefused as Deidentifier.deidentify raises them (after `emit` may have
    been called: the caller writes nothing until this returns). The result's resource is the header; no
    `entry` key is added to it (the output has none when no entry is emitted). `before`: the Bundle's keys
    that came before `entry`; returned, the keys that stay before it in the output (an element the walk
    removes and the engine adds back, such as an emptied meta, comes after it, as in the whole Bundle)."""
    path = path or "Bundle"
    version = engine.fhir_version
    if version == versions.AUTO:
        version = versions.detect(chain(versions.resources_of(header),
                                        (r for e in entries() if isinstance(e, dict)
                                         for r in versions.resources_of(e.get("resource")))), path)
    profile = engine.profile.for_version(version)
    today = engine.clock()

    # 1. the record's resources
    gone: set[str] = set()
    any_removed = False
    targets = references.target_types(header)
    patients: list[str] = []
    limits = dict(linked_age_limits or {})
    people: set[KnownIdentifier] = set()
    things: set[str] = set()
    staff: set[KnownIdentifier] = set()
    personal: set[KnownIdentifier] = set()

    def take(resources: Iterable[dict]) -> None:
        for r in resources:
            if r.get("resourceType") == "Patient":
                if r.get("id"):
                    patients.append(r["id"])
                if (limit := age_limit(r.get("birthDate"), today)) is not None:
                    limits[r.get("id") or ""] = limit
        people.update(known_ids.collect(resources))
        things.update(known_ids.thing_names(resources))
        found_staff, found_personal = known_ids.collect_staff(resources)
        staff.update(found_staff)
        personal.update(found_personal)

    take(list(iter_resources(header)))
    for entry in entries():
        names = removed(entry, profile.remove_entries)
        if names is not None:
            gone |= names
            any_removed = True
            continue
        inner = entry.get("resource") if isinstance(entry, dict) else None
        if isinstance(inner, dict) and isinstance(entry.get("fullUrl"), str):
            targets[entry["fullUrl"]] = str(inner.get("resourceType"))
        references._add_targets(inner, targets)
        take(list(iter_resources(inner)))

    record_key = f"Bundle/{header.get('id') or path}"
    single = patients[0] if len(patients) == 1 else None

    def context(known: set) -> RecordContext:
        ctx = RecordContext(profile, engine.pseudo, engine.clock, single, record_key=record_key)
        ctx.age_limits.update(limits)
        ctx.targets.update(targets)
        ctx.known = known
        ctx.thing_names = tuple(sorted(things))
        ctx.add_people(staff, personal)
        return ctx

    def batches(ctx: RecordContext, bundle) -> Iterator[list[tuple[int, object, bool]]]:
        """Walked entries, BATCH at a time: (output index, entry, whether a reference to a removed entry went
        from it); the context's per-entry state is dropped after each batch."""
        n, batch = 0, []
        for entry in entries():
            if removed(entry, profile.remove_entries) is not None:
                continue
            changed = clean_entry(entry, gone)
            out = walk_entry(entry, n, path, ctx, bundle)
            if out is not REMOVE:
                batch.append((n, out, changed))
                n += 1
            if len(batch) == BATCH:
                yield batch
                batch = []
                ctx.start_batch()
        if batch:
            yield batch

    # 2. the identifiers the rule methods find, in a walk whose output is dropped (no pseudonym reported twice)
    known_set = set(people) | set(linked)
    scratch = context(known_set)
    pseudo = engine.pseudo
    saved = pseudo.on_issue, Counter(pseudo.fpe_fallbacks)
    pseudo.on_issue = None
    try:
        bundle = walk_resource(_copy(header), path, scratch)
        scratch.start_batch()
        for _ in batches(scratch, bundle):
            pass
    finally:
        pseudo.on_issue, pseudo.fpe_fallbacks = saved
    known = tuple(sorted((k for k in known_set if len(k.value.strip()) >= 2), key=_known_order))

    # 3. the output, entry by entry
    ctx = context(set(known_set))
    ctx.staff, ctx.personal = scratch.staff, scratch.personal  # the whole Bundle's, before its first batch
    del scratch
    bundle = walk_resource(header, path, ctx)
    in_place = [k for k in header if k in before]  # keys added from here on go after the entries
    if any_removed:
        bundle.labels.add("REDACTED")
    head = ctx.pending, ctx.terms, ctx.walked, ctx.generated  # the Bundle's own: replaced and stamped after its entries
    ctx.start_batch()
    findings: list[Finding] = []
    ntexts = 0
    timings: Counter = Counter()

    for batch in batches(ctx, bundle):
        changed = {id(out.get("resource")) for _, out, went in batch if went}
        for walked, state in ctx.walked:
            if id(walked) in changed:
                state.labels.add("REDACTED")
        found, count, spent = engine.replace_texts(ctx, known, path)
        findings += found
        ntexts += count
        timings.update(spent)
        stamp_all(ctx)
        if not leak_guard.clean(output_texts({"entry": [out for _, out, _ in batch]}, ctx.generated), known):
            for n, out, _ in batch:  # the first entry with a leak, by the paths it has in the Bundle
                if type(out) is dict:
                    guard(out, ctx, known, path, profile,
                          lambda doc, _: ({"resourceType": "Bundle", "entry": [None] * n + [doc]}, path))
        for _, out, _ in batch:
            emit(out)

    ctx.pending, ctx.terms, ctx.walked, ctx.generated = head
    found, count, spent = engine.replace_texts(ctx, known, path)
    findings[:0] = found
    ntexts += count
    timings.update(spent)
    stamp_all(ctx)
    guard(header, ctx, known, path, profile)
    return RecordResult(header, findings, ntexts, dict(timings), known), in_place
