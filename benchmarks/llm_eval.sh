#!/usr/bin/env bash
# The LLM stacks' operating points on the ASQ-PHI tuning half, on a machine with Ollama and a pulled model.
#
#   DEID_ADAPTER_LLM_URL=http://127.0.0.1:11434 DEID_ADAPTER_LLM_MODEL=qwen2.5:7b-instruct benchmarks/llm_eval.sh
#
# Runs `deid-adapter eval` for precision-first, recall-first and balanced (the patterns stack as a
# baseline), keeps each JSON result in $OUT (default benchmarks/out/llm-eval-<date>), and prints a table
# with seconds per document. Counts and rates only: no note text is printed or kept.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GOLD="${GOLD:-$ROOT/../shared/data/asq-phi/tuning.jsonl}"
STACKS="${STACKS:-patterns precision-first recall-first balanced}"
OUT="${OUT:-$ROOT/benchmarks/out/llm-eval-$(date +%Y%m%d-%H%M%S)}"
: "${DEID_ADAPTER_LLM_URL:=http://127.0.0.1:11434}"
: "${DEID_ADAPTER_LLM_MODEL:=qwen2.5:7b-instruct}"
export DEID_ADAPTER_LLM_URL DEID_ADAPTER_LLM_MODEL
CLI="${CLI:-deid-adapter}"
command -v "$CLI" >/dev/null || CLI="python -m adapter.cli"

[ -f "$GOLD" ] || { echo "llm_eval: gold file not found: $GOLD" >&2; exit 2; }
curl -fsS "$DEID_ADAPTER_LLM_URL/api/tags" >/dev/null \
  || { echo "llm_eval: no Ollama at $DEID_ADAPTER_LLM_URL (start it: ollama serve)" >&2; exit 2; }
mkdir -p "$OUT"
docs=$(grep -c . "$GOLD")
echo "llm_eval: $docs documents, model $DEID_ADAPTER_LLM_MODEL at $DEID_ADAPTER_LLM_URL, results in $OUT" >&2

cd "$ROOT"
for stack in $STACKS; do
  echo "llm_eval: $stack ..." >&2
  start=$(date +%s.%N)
  $CLI eval "$GOLD" --stack "$stack" --json > "$OUT/$stack.json"
  end=$(date +%s.%N)
  python3 - "$OUT/$stack.json" "$start" "$end" "$docs" <<'PY'
import json, sys
path, start, end, docs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
result = json.load(open(path))
result["seconds"], result["seconds_per_document"] = round(end - start, 2), round((end - start) / docs, 3)
json.dump(result, open(path, "w"), indent=2)
PY
done

python3 - "$OUT" $STACKS <<'PY'
import json, sys
out, stacks = sys.argv[1], sys.argv[2:]
def value(entry):
    return entry.get("value", entry.get("point")) if isinstance(entry, dict) else entry
metrics = ("span_recall", "span_precision", "char_recall", "other_text_removed", "hard_negative_over_redaction", "strict_f1")
rows = []
for stack in stacks:
    r = json.load(open(f"{out}/{stack}.json"))
    cells = []
    for m in metrics:
        v = value(r.get(m))
        cells.append(f"{v:.3f}" if isinstance(v, (int, float)) else "-")
    prompt = next((d.get("prompt_version", "") for d in r.get("detectors", {}).values() if "prompt_version" in d), "")
    rows.append([stack, *cells, f"{r['seconds_per_document']:.3f}", prompt[:24]])
head = ["stack", "recall", "precision", "char recall", "other removed", "hard-neg over", "strict F1", "s/doc", "prompts"]
widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
for row in [head, ["-" * w for w in widths], *rows]:
    print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
PY
