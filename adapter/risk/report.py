"""The risk report as one self-contained HTML file (plots embedded as base64 PNG) and as JSON with the same figures.

matplotlib (the `report` extra) draws the plots with the Agg backend; without it the HTML is written with a
note in place of each plot and the JSON is complete. Every text in the report is a figure, a metric name, a
version or a quasi-identifier name: the caller passes figures only, never values of the release.
"""
from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from adapter import files as fhir_files


def write_json(figures: dict, path: Path) -> None:
    fhir_files.write_atomic(path, (json.dumps(figures, indent=2, sort_keys=False) + "\n").encode())


def write_html(figures: dict, path: Path) -> None:
    fhir_files.write_atomic(path, render_html(figures).encode())


def plots(figures: dict) -> dict[str, str | None]:
    """Plot name → base64 PNG, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {"class_sizes": None, "risk_by_quasi_identifier": None, "recall_by_category": None}
    out = {"class_sizes": _class_sizes(plt, figures), "risk_by_quasi_identifier": _risk_by_qi(plt, figures)}
    out["recall_by_category"] = _recall(plt, figures["residual_phi"]) if figures.get("residual_phi") else None
    return out


def _png(plt, fig) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _class_sizes(plt, figures: dict) -> str:
    dist = {int(s): c for s, c in figures["class_size_distribution"].items()}
    k = figures["target_k"]
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    sizes = sorted(dist)
    patients = [s * dist[s] for s in sizes]
    ax.bar([str(s) for s in sizes], patients, color=["#c0392b" if s < k else "#2e86c1" for s in sizes])
    ax.set_xlabel("equivalence class size")
    ax.set_ylabel("patients")
    ax.set_title(f"Patients by class size (red: below k = {k})")
    if len(sizes) > 20:
        ax.set_xticks(range(0, len(sizes), max(1, len(sizes) // 20)))
    return _png(plt, fig)


def _risk_by_qi(plt, figures: dict) -> str:
    by_qi = figures["risk_by_quasi_identifier"]
    names = list(by_qi)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.barh(names, [by_qi[q]["below_k_share_without"] for q in names], color="#5d6d7e")
    ax.axvline(figures["below_k_share"], color="#c0392b", linestyle="--", label="with all quasi-identifiers")
    ax.set_xlabel(f"share of patients below k = {figures['target_k']} with this one left out")
    ax.set_xlim(0, 1)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Risk by quasi-identifier")
    return _png(plt, fig)


def _recall(plt, phi: dict) -> str:
    cats = list(phi["recall_by_category"])
    vals = [phi["recall_by_category"][c]["value"] for c in cats]
    lo = [v - phi["recall_by_category"][c]["ci95"][0] for c, v in zip(cats, vals)]
    hi = [phi["recall_by_category"][c]["ci95"][1] - v for c, v in zip(cats, vals)]
    fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(cats) + 1.2))
    ax.errorbar(vals, range(len(cats)), xerr=[lo, hi], fmt="o", color="#1e8449", capsize=3)
    ax.set_yticks(range(len(cats)), [f"{c} (n={phi['recall_by_category'][c]['gold']})" for c in cats], fontsize=8)
    ax.set_xlim(0, 1.02)
    ax.invert_yaxis()
    ax.set_xlabel("span recall with 95% bootstrap interval")
    ax.set_title("Recall by category (gold sample)")
    return _png(plt, fig)


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _num(value, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return _e(value)


def _ci(entry: dict, digits: int = 4) -> str:
    ci = entry.get("ci95")
    return (f"{_num(entry['value'], digits)} [{_num(ci[0], digits)}, {_num(ci[1], digits)}]" if ci
            else _num(entry["value"], digits))


def _table(rows: list[tuple], header: tuple | None = None) -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _img(data: str | None, alt: str) -> str:
    if not data:
        return f"<p class=note>{_e(alt)}: plot not drawn (install the <code>report</code> extra for matplotlib).</p>"
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def render_html(figures: dict) -> str:
    """The whole report; every dynamic value is escaped."""
    images = plots(figures)
    risks = figures["risks"]
    checks = figures.get("thresholds") or []
    verdict = "PASS" if all(c["passed"] for c in checks) else "FAIL"
    release = figures["release"]
    versions = figures["versions"]
    audit = figures["audit"]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>Re-identification risk report</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:60em;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
        "th{background:#f4f6f7}.pass{color:#1e8449;font-weight:bold}.fail{color:#c0392b;font-weight:bold}"
        ".note{color:#666;font-size:.9em}img{max-width:100%}code{background:#f4f6f7;padding:0 .2em}",
        "</style></head><body>",
        f"<h1>Re-identification risk report <span class={verdict.lower()}>{verdict}</span></h1>",
        f"<p class=note>Generated {_e(figures['generated'])} by deid-adapter {_e(versions.get('deid-adapter', ''))}. "
        "Figures only: no value, code or text of the release appears in this report.</p>",
        "<h2>Thresholds</h2>",
        _table([(_e(c["check"]), _num(c["value"]) if c["value"] is not None else "not measured",
                 f"<span class={'pass' if c['passed'] else 'fail'}>{'pass' if c['passed'] else 'FAIL'}</span>")
                for c in checks], ("check", "value", "result")) if checks else "<p>No thresholds configured.</p>",
        "<h2>Release</h2>",
        _table([("format", _e(release["format"])), ("files", _num(release["files"])),
                ("resources / messages", _num(release["items"])), ("patients", _num(figures["patients"])),
                ("narrative characters", _num(release["narrative_chars"])),
                ("unreadable files", _num(release["unreadable_files"])),
                ("pseudonym key id(s)", _e(", ".join(release["key_ids"]) or "none found")),
                ("profile(s)", _e(", ".join(release["profiles"]) or "none found"))]),
        "<h2>Versions</h2>",
        _table([(_e(k), _e(json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v))
                for k, v in versions.items()]),
        "<h2>Audit trail</h2>",
        _table([(_e(k), _e(v)) for k, v in audit.items() if not isinstance(v, (dict, list))]),
        "<h2>k-anonymity</h2>",
        f"<p>Quasi-identifiers: {_e(', '.join(figures['quasi_identifiers']))}.</p>",
        _table([("k (smallest class)", _num(figures["k_anonymity"])), ("target k", _num(figures["target_k"])),
                ("equivalence classes", _num(figures["equivalence_classes"])),
                ("patients in classes below k", f"{_num(figures['below_k_patients'])} ({_num(figures['below_k_share'])})")]),
        _img(images["class_sizes"], "class-size histogram"),
        "<h2>Re-identification risk</h2>",
        _table([("prosecutor", _num(risks["prosecutor_max"]), _num(risks["prosecutor_avg"])),
                ("journalist", _num(risks["journalist_max"]), _num(risks["journalist_avg"])),
                ("marketer", "", _num(risks["marketer"]))], ("attacker", "maximum", "average")),
        f"<p class=note>Population: {_num(figures['population']['size'])} people; {_e(figures['population']['assumption'])}. "
        "Prosecutor risk of a patient is 1/f (f: its class size in the release); journalist risk 1/F (F: the class "
        "size in the population); marketer risk is the expected share of patients re-identified, (1/n)·Σ f/F.</p>",
        _img(images["risk_by_quasi_identifier"], "risk by quasi-identifier"),
    ]
    if "l_diversity" in figures:
        ld = figures["l_diversity"]
        parts += ["<h2>l-diversity</h2>",
                  _table([("sensitive attribute", _e(ld["attribute"])), ("distinct l", _num(ld["l"])),
                          ("largest share of a class holding one value", _num(ld["max_confidence"])),
                          ("classes where every member holds one value", _num(ld["homogeneous_classes"])),
                          ("classes with fewer than 2 distinct values", _num(ld["classes_below_2"]))])]
    sug = figures["suggested_generalizations"]
    parts += ["<h2>Suggested generalizations</h2>",
              f"<p>Target k = {_num(sug['target_k'])}: "
              + ("already met." if not sug["steps"]
                 else ("reached" if sug["reached"] else "not reached") + " by these steps, in order:")
              + "</p>"]
    if sug["steps"]:
        parts.append(_table([(str(i), _e(s["quasi_identifier"]), _e(s["to"]), _num(s["k"]), _num(s["below_k_share"]),
                              _num(s["classes"])) for i, s in enumerate(sug["steps"], 1)],
                            ("step", "quasi-identifier", "generalize to", "k after", "share below k after", "classes")))
    phi = figures.get("residual_phi")
    parts.append("<h2>Residual PHI estimate</h2>")
    if phi:
        parts += [
            _table([("stack", _e(phi.get("stack", ""))), ("gold documents", _num(phi["gold_documents"])),
                    ("gold spans (missed)", f"{_num(phi['gold_spans'])} ({_num(phi['missed_gold_spans'])})"),
                    ("span recall, 95% CI", _ci(phi["span_recall"])), ("character recall, 95% CI", _ci(phi["char_recall"])),
                    ("PHI density of gold text", _num(phi["phi_density"], 5)),
                    ("release narrative characters", _num(phi["narrative_chars"])),
                    ("projected residual PHI characters, 95% CI", _ci(phi["residual_phi_chars"], 1)),
                    ("projected residual PHI spans, 95% CI", _ci(phi["residual_phi_spans"], 1))]),
            f"<p class=note>{_e(phi['method'])}.</p>",
            _img(images["recall_by_category"], "recall by category")]
    else:
        parts.append("<p class=note>Not measured: run with <code>--gold GOLD.jsonl</code> (the site's own annotated notes).</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
