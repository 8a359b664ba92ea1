"""Pretraining data: corpus reading, NSP pairs, streamed shards, masking statistics (tiny vocabularies)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bert.tokenizer import BertTokenizer
from training.data.pretraining import (
    IGNORE_INDEX,
    MaskingConfig,
    PretrainingShards,
    continuation_flags,
    create_pretraining_data,
    instances_from_document,
    mask_tokens,
    read_documents,
    truncate_seq_pair,
)

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a cat dog sat on mat ran fast slow red blue green big small house tree car road sun moon star "
    "good bad film movie plot actor great awful boring fun day night man woman child play played run "
    "walk talk see saw look eat ate drink water food bread milk city town river hill sky rain snow "
    "wind cold hot warm old new young happy sad book read write pen paper door window room table chair "
    "one two three four five six seven eight nine ten . , ! ?"
).split()
PIECES = ["##s", "##ed", "##ing", "##er", "##ly"]


def tiny_tokenizer(tmp_path) -> BertTokenizer:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + WORDS + PIECES) + "\n")
    return BertTokenizer.from_vocab(vocab)


def masking(tokenizer, **kw) -> MaskingConfig:
    return MaskingConfig(
        mask_token_id=tokenizer.mask_token_id,
        vocab_size=tokenizer.vocab_size,
        special_ids=tuple(tokenizer.all_special_ids),
        **kw,
    )


# ----------------------------------------------------------------------------- corpus


def test_read_documents_crlf_bom_and_blank_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes("\ufeffOne sentence .\r\nTwo sentence .\r\n\r\n  \r\nThird doc .\r\n".encode("utf-8"))
    other = tmp_path / "d.txt"
    other.write_text("Another file .\n")
    docs = list(read_documents([path, other]))
    assert docs == [["One sentence .", "Two sentence ."], ["Third doc ."], ["Another file ."]]


# ----------------------------------------------------------------------------- NSP instances


def _numbered_documents(n_docs=40, n_sentences=12, length=7):
    """Token ids that encode (document, sentence, position), so adjacency is checkable."""
    return [[[100000 * d + 100 * s + t for t in range(length)] for s in range(n_sentences)] for d in range(n_docs)]


def test_nsp_is_balanced_and_isnext_pairs_are_adjacent():
    docs = _numbered_documents()
    rng = random.Random(1)
    instances = [
        inst
        for _ in range(10)
        for d in range(len(docs))
        for inst in instances_from_document(docs, d, max_seq_length=64, short_seq_prob=0.1, rng=rng)
    ]
    assert len(instances) > 1000
    not_next = np.mean([i.is_random_next for i in instances])
    assert abs(not_next - 0.5) < 0.04, not_next
    for inst in instances:
        assert len(inst.tokens_a) + len(inst.tokens_b) <= 64 - 3
        doc_a = {t // 100000 for t in inst.tokens_a}
        doc_b = {t // 100000 for t in inst.tokens_b}
        assert len(doc_a) == 1 and len(doc_b) == 1
        if inst.is_random_next:
            assert doc_a != doc_b
        else:
            assert doc_a == doc_b
            # B continues A: the first B token directly follows the last A token in the document,
            # unless truncation trimmed the inner edges -- so compare positions in the flattened document.
            flat = [t for s in docs[doc_a.pop()] for t in s]
            assert flat.index(inst.tokens_b[0]) > flat.index(inst.tokens_a[-1])
            if len(inst.tokens_a) + len(inst.tokens_b) < 64 - 3:  # untruncated: B starts right after A
                assert flat.index(inst.tokens_b[0]) == flat.index(inst.tokens_a[-1]) + 1
            span = flat[flat.index(inst.tokens_a[0]) : flat.index(inst.tokens_b[-1]) + 1]
            assert set(inst.tokens_a) | set(inst.tokens_b) <= set(span)


def test_short_sequences_appear_with_probability_about_point_one():
    docs = _numbered_documents(n_docs=200, n_sentences=40, length=10)
    rng = random.Random(2)
    first = [instances_from_document(docs, d, max_seq_length=128, short_seq_prob=0.1, rng=rng)[0] for d in range(200)]
    short = np.mean([len(i.tokens_a) + len(i.tokens_b) < 100 for i in first])
    assert 0.03 < short < 0.2


def test_truncate_seq_pair_trims_the_longer_side():
    a, b = list(range(10)), list(range(3))
    truncate_seq_pair(a, b, 8, random.Random(0))
    assert len(a) + len(b) == 8 and len(b) == 3


# ----------------------------------------------------------------------------- masking


def test_masking_proportions_80_10_10_and_never_special(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    cfg = masking(tok, max_predictions_per_seq=200)
    rng = np.random.default_rng(0)
    base = rng.integers(5, tok.vocab_size, size=(400, 100))
    chosen = masked = randomised = kept = total = 0
    for row in base:
        ids = np.concatenate(
            [[tok.cls_token_id], row[:60], [tok.sep_token_id], row[60:], [tok.sep_token_id], [tok.pad_token_id] * 5]
        )
        out, labels = mask_tokens(ids, cfg, rng)
        selected = labels != IGNORE_INDEX
        assert not selected[np.isin(ids, tok.all_special_ids)].any()  # never [CLS]/[SEP]/[PAD]
        assert (labels[selected] == ids[selected]).all()
        assert (out[~selected] == ids[~selected]).all()
        assert selected.sum() == round(100 * 0.15)
        chosen += selected.sum()
        masked += (out[selected] == tok.mask_token_id).sum()
        kept += (out[selected] == ids[selected]).sum()
        randomised += ((out[selected] != ids[selected]) & (out[selected] != tok.mask_token_id)).sum()
        assert not np.isin(out[selected & (out != tok.mask_token_id)], tok.all_special_ids).any()
        total += 100
    assert chosen / total == pytest.approx(0.15, abs=1e-9)
    assert masked / chosen == pytest.approx(0.8, abs=0.02)
    # a random replacement can equal the original (1/vocab): count it as kept, as BERT does
    assert (kept / chosen) == pytest.approx(0.1, abs=0.015)
    assert (randomised / chosen) == pytest.approx(0.1, abs=0.015)


def test_max_predictions_per_seq_is_respected(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    cfg = masking(tok, max_predictions_per_seq=5)
    rng = np.random.default_rng(1)
    for _ in range(50):
        ids = np.concatenate([[tok.cls_token_id], rng.integers(5, tok.vocab_size, 120), [tok.sep_token_id]])
        _, labels = mask_tokens(ids, cfg, rng)
        assert (labels != IGNORE_INDEX).sum() == 5


def test_whole_word_masking_masks_whole_words(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    cfg = masking(tok, whole_word_mask=True, continuation=continuation_flags(tok), max_predictions_per_seq=40)
    text = " ".join(["walked talking readers played looks"] * 8)
    ids = np.array(tok.encode_batch([text])[0].ids)
    pieces = tok.convert_ids_to_tokens(ids)
    assert any(p.startswith("##") for p in pieces)
    rng = np.random.default_rng(3)
    for _ in range(200):
        _, labels = mask_tokens(ids, cfg, rng)
        selected = labels != IGNORE_INDEX
        for i in range(1, len(ids) - 1):
            if pieces[i].startswith("##"):  # a continuation is chosen exactly when its word start is
                assert selected[i] == selected[i - 1], (pieces, selected)


def test_dynamic_masks_differ_between_batches_but_repeat_for_the_same_seed(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    cfg = masking(tok)
    ids = np.concatenate([[tok.cls_token_id], np.arange(5, 85), [tok.sep_token_id]])
    a = mask_tokens(ids, cfg, np.random.default_rng([7, 0, 1]))[1]
    b = mask_tokens(ids, cfg, np.random.default_rng([7, 1, 1]))[1]
    c = mask_tokens(ids, cfg, np.random.default_rng([7, 0, 1]))[1]
    assert (a != b).any() and (a == c).all()


# ----------------------------------------------------------------------------- shards


def test_streamed_shards_roundtrip(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    corpus = tmp_path / "corpus.txt"
    rng = random.Random(0)
    lines = []
    for _document in range(30):
        for _sentence in range(8):
            lines.append(" ".join(rng.choice(WORDS[:-4]) for _ in range(rng.randint(3, 12))) + " .")
        lines.append("")
    corpus.write_text("\r\n".join(lines))
    index = create_pretraining_data(
        [corpus],
        tok,
        tmp_path / "data",
        max_seq_length=32,
        dupe_factor=3,
        heldout_percent=30,
        documents_per_buffer=7,
        instances_per_shard=50,
    )
    train = PretrainingShards(tmp_path / "data", "train")
    assert len(index["shards"]["train"]) > 2  # really sharded
    assert len(train) == index["counts"]["train"]["instances"] == sum(s["instances"] for s in index["shards"]["train"])
    heldout = PretrainingShards(tmp_path / "data", "heldout")
    assert len(heldout) == index["counts"]["heldout"]["instances"] > 0
    nsp = []
    for i in range(len(train)):
        ids, a_length, label = train[i]
        assert ids[0] == tok.cls_token_id and ids[a_length - 1] == tok.sep_token_id and ids[-1] == tok.sep_token_id
        assert len(ids) <= 32 and 2 < a_length < len(ids)
        nsp.append(label)
    assert 0.35 < np.mean(nsp) < 0.65
    again = create_pretraining_data(
        [corpus],
        tok,
        tmp_path / "again",
        max_seq_length=32,
        dupe_factor=3,
        heldout_percent=30,
        documents_per_buffer=7,
        instances_per_shard=50,
    )
    assert again["counts"] == index["counts"]  # seeded: the same instances every time
