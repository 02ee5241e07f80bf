// The review page: one key or click per span (confirm, reject, change category), add missed spans, release.
// Offsets are counted in code points, as Python counts str indices.
(function () {
  "use strict";
  const root = document.getElementById("review");
  if (!root) return;
  const csrf = document.querySelector("meta[name=csrf-token]").content;
  const SHORTCUTS = ["NAME", "GEOGRAPHIC_LOCATION", "DATE", "PHONE_NUMBER", "EMAIL_ADDRESS",
                     "MEDICAL_RECORD_NUMBER", "UNIQUE_IDENTIFIER", "ACCOUNT_NUMBER", "AGE_OVER_89"];
  const texts = {};
  document.querySelectorAll("script.text-data").forEach(s => { texts[s.dataset.text] = JSON.parse(s.textContent); });
  const current = document.getElementById("current");
  const select = document.getElementById("category");
  const status = document.getElementById("status");
  let focused = null;
  let released = false;

  const marks = () => Array.from(root.querySelectorAll("mark.span"));
  const cps = s => Array.from(s);

  function describe(m) {
    const state = { pending: "undecided", confirm: "confirmed", reject: "rejected", change: "changed", add: "added" }[m.dataset.action];
    return `${m.dataset.category}${m.dataset.confidence ? " " + m.dataset.confidence : ""} · ${state}`;
  }

  function paint(m) {
    m.className = `span cat-${m.dataset.category} act-${m.dataset.action}` + (m.dataset.suspect === "1" ? " suspect" : "");
    m.dataset.label = describe(m);
    m.setAttribute("aria-label", `${m.textContent}: ${describe(m)}`);
    if (m === focused) show(m);
    counts();
  }

  function show(m) {
    focused = m;
    current.textContent = `“${m.textContent}” — ${describe(m)}`;
    select.value = m.dataset.category;
  }

  function counts() {
    const all = marks(), by = a => all.filter(m => m.dataset.action === a).length;
    document.getElementById("counts").textContent =
      `${all.length} spans: ${by("confirm")} confirmed, ${by("reject")} rejected, ${by("change")} changed, ` +
      `${by("add")} added, ${by("pending")} undecided (undecided spans are released as confirmed).`;
  }

  function act(m, action, category) {
    if (!m || released) return;
    if (m.dataset.action === "add") {
      if (action === "reject") { const note = m.parentElement; m.remove(); rebuild(note, null); focused = null; counts(); return; }
      if (category) m.dataset.category = category;
    } else if (action === "reject" && m.dataset.suspect !== "1") {
      // the server refuses it too: a span at or above its threshold was not routed for review
      document.getElementById("status").textContent = "Only spans below their category's threshold (dashed) can be rejected.";
      return;
    } else if (action === "change") {
      m.dataset.category = category;
      m.dataset.action = category === m.dataset.original ? "confirm" : "change";
    } else {
      m.dataset.category = m.dataset.original;
      m.dataset.action = action;
    }
    paint(m);
  }

  function move(step) {
    const all = marks();
    if (!all.length) return;
    const i = all.indexOf(document.activeElement);
    all[(i + step + all.length) % all.length].focus();
  }

  // Rebuild one note from its text and its marks' data, plus `extra` (a span to add).
  function rebuild(note, extra) {
    const chars = cps(texts[note.dataset.text]);
    const spans = Array.from(note.querySelectorAll("mark.span")).map(m => Object.assign({}, m.dataset));
    if (extra) spans.push(extra);
    spans.sort((a, b) => a.start - b.start);
    note.textContent = "";
    let pos = 0, made = null;
    for (const s of spans) {
      const a = +s.start, b = +s.end;
      if (a > pos) note.append(chars.slice(pos, a).join(""));
      const m = document.createElement("mark");
      Object.assign(m.dataset, s);
      m.tabIndex = 0;
      m.setAttribute("role", "button");
      m.textContent = chars.slice(a, b).join("");
      note.append(m);
      paint(m);
      if (s === extra) made = m;
      pos = b;
    }
    if (pos < chars.length) note.append(chars.slice(pos).join(""));
    return made;
  }

  function addSpan(note, start, end, category) {
    if (released) return false;
    if (!(start < end)) return false;
    const overlaps = Array.from(note.querySelectorAll("mark.span")).some(m => start < +m.dataset.end && +m.dataset.start < end);
    if (overlaps) { status.textContent = "That text overlaps a marked span: reject the span first, then add the whole text."; return false; }
    const m = rebuild(note, { text: note.dataset.text, start: String(start), end: String(end), category: category,
                              original: category, confidence: "", action: "add", origin: "" });
    m.focus();
    status.textContent = `Added ${category}.`;
    return true;
  }

  function offsetIn(note, node, offset) {
    const r = document.createRange();
    r.setStart(note, 0);
    r.setEnd(node, offset);
    return cps(r.toString()).length;
  }

  function addFromSelection() {
    const sel = window.getSelection();
    if (!sel || sel.isCollapsed || !sel.rangeCount) return false;
    const range = sel.getRangeAt(0);
    const note = range.commonAncestorContainer.nodeType === 1 ? range.commonAncestorContainer.closest(".note")
                                                               : range.commonAncestorContainer.parentElement.closest(".note");
    if (!note) { status.textContent = "Select text inside one note."; return true; }
    let start = offsetIn(note, range.startContainer, range.startOffset);
    let end = offsetIn(note, range.endContainer, range.endOffset);
    const chars = cps(texts[note.dataset.text]);
    while (start < end && /\s/.test(chars[start])) start++;
    while (end > start && /\s/.test(chars[end - 1])) end--;
    sel.removeAllRanges();
    addSpan(note, start, end, document.getElementById("add-category").value);
    return true;
  }

  function addByText(wanted, category) {
    const w = cps(wanted.trim());
    if (!w.length) return;
    for (const note of root.querySelectorAll(".note")) {
      const chars = cps(texts[note.dataset.text]);
      for (let i = 0; i + w.length <= chars.length; i++) {
        if (w.every((c, k) => chars[i + k] === c)) {
          const free = !Array.from(note.querySelectorAll("mark.span")).some(m => i < +m.dataset.end && +m.dataset.start < i + w.length);
          if (free) { addSpan(note, i, i + w.length, category); return; }
        }
      }
    }
    status.textContent = "Not found outside the marked spans.";
  }

  async function release() {
    if (released) return;
    const decisions = marks().map(m => m.dataset.action === "add"
      ? { text: +m.dataset.text, start: +m.dataset.start, end: +m.dataset.end, category: m.dataset.category, action: "add" }
      : { text: +m.dataset.text, origin: +m.dataset.origin, category: m.dataset.category,
          action: m.dataset.action === "pending" ? "confirm" : m.dataset.action });
    status.textContent = "Releasing…";
    const res = await fetch(`/records/${root.dataset.id}/release`, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify({ decisions: decisions }) });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) { status.textContent = `Not released: ${body.error || res.status}`; return; }
    released = true;
    root.classList.add("released");
    status.innerHTML = "";
    const link = document.createElement("a");
    link.href = body.next;
    link.id = "next";
    link.textContent = body.next === "/" ? "Back to the queue" : "Next record";
    status.append(`Released (audit record ${body.audit_seq}). `, link);
    link.focus();
  }

  root.addEventListener("focusin", e => { if (e.target.matches("mark.span")) show(e.target); });
  root.addEventListener("click", e => { const m = e.target.closest("mark.span"); if (m) m.focus(); });
  document.getElementById("btn-confirm").addEventListener("click", () => act(focused, "confirm"));
  document.getElementById("btn-reject").addEventListener("click", () => act(focused, "reject"));
  select.addEventListener("change", () => act(focused, "change", select.value));
  document.getElementById("release").addEventListener("click", release);
  document.getElementById("add-form").addEventListener("submit", e => {
    e.preventDefault();
    const input = document.getElementById("add-text");
    addByText(input.value, document.getElementById("add-category").value);
    input.value = "";
  });

  document.addEventListener("keydown", e => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); release(); return; }
    if (e.target.closest("input, select, textarea, button") || e.altKey || e.ctrlKey || e.metaKey) return;
    const m = e.target.closest ? e.target.closest("mark.span") : null;
    if (e.key === "a") { e.preventDefault(); if (!addFromSelection()) document.getElementById("add-text").focus(); return; }
    if (e.key === "j") { e.preventDefault(); move(1); return; }
    if (e.key === "k") { e.preventDefault(); move(-1); return; }
    if (!m) return;
    if (e.key === "c" || e.key === "Enter" || e.key === " ") { e.preventDefault(); act(m, "confirm"); }
    else if (e.key === "r" || e.key === "x" || e.key === "Delete" || e.key === "Backspace") { e.preventDefault(); act(m, "reject"); }
    else if (/^[1-9]$/.test(e.key)) { e.preventDefault(); act(m, "change", SHORTCUTS[+e.key - 1]); }
  });

  marks().forEach(m => { m.dataset.suspect = m.classList.contains("suspect") ? "1" : "0"; paint(m); });
})();
