"""Export a token-classification model folder to the ONNX file the NER detector runs (`model.onnx`).

    python -m text_deid.ner_training.export [MODEL_DIR] [--precision int8|fp32] [--out FILE]

Deterministic: the same weights, torch and onnxruntime give the same bytes (a fixed trace input, the
TorchScript exporter, eager attention, no time stamps). The graph takes `input_ids` and `attention_mask`
(batch x tokens, int64) and returns `logits` (batch x tokens x labels). `int8` (the default, what ships)
quantizes the weights of its matrix products dynamically (onnxruntime.quantization); `fp32` keeps them.
The file records the labels and a digest of the weights it came from, so the detector refuses a
`model.onnx` left behind by a retraining. Needs the `ner-train` extra (torch, transformers, onnx).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

from text_deid.detectors.ner import DEFAULT_MODEL, ONNX_FILE, weights_digest

OPSET = 17
PRECISIONS = ("int8", "fp32")


def export(model_dir: str | os.PathLike, precision: str = "int8", out: str | os.PathLike | None = None) -> Path:
    """Write the ONNX graph of the model in `model_dir` (default: `model_dir/model.onnx`); returns its path."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModelForTokenClassification

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}")
    model_dir = Path(model_dir)
    out = Path(out) if out else model_dir / ONNX_FILE
    model = AutoModelForTokenClassification.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    labels = [str(model.config.id2label[i]) for i in range(model.config.num_labels)]

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).logits

    # a fixed trace input: two rows, the second padded, so the mask's path is traced as the detector uses it
    ids = torch.full((2, 8), 1, dtype=torch.long)
    mask = torch.ones((2, 8), dtype=torch.long)
    mask[1, 5:] = 0
    axes = {0: "batch", 1: "tokens"}
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on shapes it fixes; the graph is checked by tests
            torch.onnx.export(Logits(model), (ids, mask), str(fp32), input_names=["input_ids", "attention_mask"],
                              output_names=["logits"], opset_version=OPSET, dynamo=False, do_constant_folding=True,
                              dynamic_axes={"input_ids": axes, "attention_mask": axes, "logits": axes})
        graph = fp32
        if precision == "int8":
            graph = Path(tmp) / "int8.onnx"
            quantize_dynamic(str(fp32), str(graph), weight_type=QuantType.QInt8)
        proto = onnx.load(str(graph))
        del proto.metadata_props[:]
        for key, value in (("labels", json.dumps(labels)), ("precision", precision),
                           ("source_sha256", weights_digest(model_dir))):
            proto.metadata_props.add(key=key, value=value)
        proto.producer_name, proto.producer_version = "text_deid.ner_training.export", ""
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        onnx.save(proto, str(partial))
        os.replace(partial, out)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", nargs="?", default=DEFAULT_MODEL,
                    help="a token-classification model folder (default: the project's)")
    ap.add_argument("--precision", choices=PRECISIONS, default="int8")
    ap.add_argument("--out", default=None, help="where to write (default: MODEL_DIR/model.onnx)")
    a = ap.parse_args(argv)
    path = export(a.model_dir, a.precision, a.out)
    print(f"wrote {path} ({a.precision}, {path.stat().st_size:,} bytes, "
          f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:12]})")


if __name__ == "__main__":
    main()
