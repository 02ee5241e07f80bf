"""The NER's world training data (text_deid/ner_training/world.py): spans are the planted values at exact
offsets, every missed form is planted, the splits share no values, and characters the tokenizer could not
spell become its own tokens."""
from __future__ import annotations

import pytest

pytest.importorskip("faker")

from text_deid.ner_training import synth, world  # noqa: E402

FORMS = {"single", "lowercase", "upper", "non-ascii", "multi-part", "plain"}


@pytest.fixture(scope="module")
def docs():
    return world.generate_world(300, seed=5, split="train")


def test_spans_are_planted_values_at_exact_offsets(docs):
    cats = set()
    for d in docs:
        assert d["genre"] == "world"
        for s in d["spans"]:
            value = d["text"][s["start"]:s["end"]]
            assert value and value == value.strip(), d["id"]
            cats.add(s["category"])
            if s["category"] in ("NAME", "GEOGRAPHIC_LOCATION") and "form" in s:
                assert s["form"] in FORMS
                if s["form"] != "upper":  # a document written in capitals makes any span upper
                    assert world.form_of(value) == s["form"]
    assert {"NAME", "GEOGRAPHIC_LOCATION", "EMAIL_ADDRESS"} <= cats


def test_every_missed_form_is_planted(docs):
    forms = {(s["category"], s["form"]) for d in docs for s in d["spans"] if "form" in s}
    for form in ("single", "lowercase", "upper", "non-ascii", "multi-part"):
        assert ("NAME", form) in forms, form
    assert ("GEOGRAPHIC_LOCATION", "non-ascii") in forms and ("GEOGRAPHIC_LOCATION", "upper") in forms
    texts = "\n".join(d["text"] for d in docs)
    assert any(u in texts for u in ("Suite ", "Apt", "Unit ", "Flat ")), "unit designators"
    assert any(not c.isascii() and not ("\u00c0" <= c <= "\u024f") for c in texts), "a non-Latin script"


@pytest.mark.parametrize("value, form", [
    ("Okonkwo", "single"), ("jorge", "lowercase"), ("VALDEZ", "upper"), ("Nguyễn Thị Hoa", "non-ascii"),
    ("van der Berg", "multi-part"), ("Garcia-Reyes", "multi-part"), ("O'Brien", "multi-part"),
    ("Anna Smith", "plain"), ("Søndergaard", "non-ascii"),
])
def test_form_of(value, form):
    assert world.form_of(value) == form


def test_train_and_heldout_share_no_values():
    train, held = world.world_locales("train"), world.world_locales("heldout")
    for attr in ("first", "last", "cities", "postcodes"):
        a = {v for loc in train for v in getattr(loc, attr)}
        b = {v for loc in held for v in getattr(loc, attr)}
        assert a and b and not a & b, attr


def test_deterministic():
    assert world.generate_world(20, seed=9, split="heldout") == world.generate_world(20, seed=9, split="heldout")


def test_world_documents_leave_the_others_unchanged():
    plain = synth.generate(40, seed=4, split="train")
    mixed = world.generate(40, seed=4, split="train", world=25)
    assert [d for d in mixed if d["genre"] != "world"] == plain
    assert sum(d["genre"] == "world" for d in mixed) == 25


def test_extended_vocabulary_spells_new_characters():
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast

    from text_deid.ner_training.train import _with_chars, extend_vocab

    base = PreTrainedTokenizerFast(tokenizer_object=_tiny_tokenizer(), unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    text = "Søndergaard møder Søren"
    assert "[UNK]" in base.tokenize(text)
    added = extend_vocab(base, [text] * 3, 10)
    assert added == ["ø"]
    grown = _with_chars(base, added)
    assert "[UNK]" not in grown.tokenize(text)
    assert grown.tokenize("Søren")[:2] == ["S", "##ø"]
    assert base.tokenize("Sandgaard") == grown.tokenize("Sandgaard")  # the old pieces are kept


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters,
                                         *("##" + c for c in letters), "##aard", "##nder"])}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(strip_accents=False, lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def test_pools_do_not_depend_on_the_processes_string_hashes(tmp_path):
    """A corpus is a function of its seed: two processes with other hash seeds draw the same values."""
    import os
    import subprocess
    import sys

    code = ("import hashlib, json; from text_deid.ner_training.world import world_locales; "
            "print(hashlib.sha1(json.dumps([vars(x) for x in world_locales('heldout')]).encode()).hexdigest())")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root, "PYTHONWARNINGS": "ignore"}
        out.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                               timeout=300).stdout.strip())
    assert len(out) == 1
