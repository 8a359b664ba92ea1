"""bert.tokenizer: ids and offsets identical to transformers' BertTokenizerFast on real data,
training a vocabulary, saving and loading, and the InputTooLong contract."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from bert.tokenizer import BertTokenizer, InputTooLong

NUM_SQUAD_CONTEXTS = 1000


# ---- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def squad_examples(data_dir) -> list[tuple[str, str]]:
    """(first question, context) of the first NUM_SQUAD_CONTEXTS SQuAD train paragraphs."""
    examples = []
    for part in sorted((data_dir / "squad-train").glob("train-v1.1.part-*.json.gz")):
        with gzip.open(part, "rt", encoding="utf-8") as f:
            for article in json.load(f)["data"]:
                for paragraph in article["paragraphs"]:
                    examples.append((paragraph["qas"][0]["question"], paragraph["context"]))
                    if len(examples) == NUM_SQUAD_CONTEXTS:
                        return examples
    return examples


@pytest.fixture(scope="module", params=["minilm-dir", "bert-vocab"])
def tokenizer_pair(request, transformers, tmp_path_factory):
    """(ours, transformers') built from the same files: the MiniLM dir, and a bare BERT vocab.txt."""
    if request.param == "minilm-dir":
        path = request.getfixturevalue("minilm_dir")
        return BertTokenizer.from_dir(path), transformers.BertTokenizerFast.from_pretrained(str(path))
    vocab = request.getfixturevalue("data_dir") / "bert-vocab" / "vocab.txt"
    bare = tmp_path_factory.mktemp("bert-vocab")
    shutil.copy(vocab, bare / "vocab.txt")
    return BertTokenizer.from_vocab(vocab), transformers.BertTokenizerFast.from_pretrained(str(bare))


def _count_identical(ours_encodings, theirs: dict) -> int:
    identical = 0
    for i, encoding in enumerate(ours_encodings):
        identical += (
            list(encoding.ids) == list(theirs["input_ids"][i])
            and list(encoding.type_ids) == list(theirs["token_type_ids"][i])
            and [tuple(o) for o in encoding.offsets] == [tuple(o) for o in theirs["offset_mapping"][i]]
        )
    return identical


# ---- parity with BertTokenizerFast --------------------------------------------------------------
def test_sst2_sentences_identical(tokenizer_pair, sst2_dev):
    ours, theirs = tokenizer_pair
    sentences = [sentence for sentence, _ in sst2_dev]
    expected = theirs(sentences, return_offsets_mapping=True)
    identical = _count_identical(ours.encode_batch(sentences), expected)
    assert identical == len(sentences) == 872, f"{identical}/{len(sentences)} SST-2 sentences identical"


def test_squad_contexts_identical(tokenizer_pair, squad_examples):
    ours, theirs = tokenizer_pair
    contexts = [context for _, context in squad_examples]
    expected = theirs(contexts, return_offsets_mapping=True)  # no truncation: some exceed 512 tokens
    identical = _count_identical(ours.encode_batch(contexts), expected)
    assert identical == len(contexts) == NUM_SQUAD_CONTEXTS, f"{identical}/{len(contexts)} contexts identical"


def test_squad_question_context_windows_identical(tokenizer_pair, squad_examples):
    """Pairs cut with only_second at 384 tokens, stride 128: every overflow window must match too."""
    ours, theirs = tokenizer_pair
    questions = [q for q, _ in squad_examples]
    contexts = [c for _, c in squad_examples]
    expected = theirs(
        questions,
        contexts,
        truncation="only_second",
        max_length=384,
        stride=128,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    encodings = ours.encode_batch(
        questions, contexts, truncation="only_second", max_length=384, stride=128, return_overflowing=True
    )
    windows = [w for encoding in encodings for w in [encoding, *encoding.overflowing]]
    assert len(windows) == len(expected["input_ids"]) > len(contexts)  # some contexts need several windows
    identical = _count_identical(windows, expected)
    assert identical == len(windows), f"{identical}/{len(windows)} windows identical"


def test_padded_call_matches_transformers(tokenizer_pair):
    ours, theirs = tokenizer_pair
    texts = ["Hello, world!", "Unaffable naïve résumé of 東京 [MASK] costs $3.50", ""]
    pairs = ["a pair", "another, longer pair of sentences", "x"]
    for args in ((texts,), (texts, pairs)):
        got = ours(*args)
        want = theirs(
            *args, padding=True, return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="np"
        )
        for key in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "offset_mapping"):
            assert got[key].dtype == np.int64
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_truncation_strategies_match_transformers(tokenizer_pair):
    ours, theirs = tokenizer_pair
    first = ["one two three four five six seven eight nine ten"] * 2
    second = ["alpha beta gamma", "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda"]
    for strategy in (True, "longest_first", "only_first", "only_second"):
        if strategy == "only_second":
            got = ours.encode_batch(first[:1], second[1:], max_length=16, truncation=strategy)
            want = theirs(first[:1], second[1:], max_length=16, truncation=strategy)
        else:
            got = ours.encode_batch(first, second, max_length=16, truncation=strategy)
            want = theirs(first, second, max_length=16, truncation=strategy)
        assert [list(e.ids) for e in got] == [list(ids) for ids in want["input_ids"]], strategy


def test_vocab_tokens_and_decode_match_transformers(tokenizer_pair):
    ours, theirs = tokenizer_pair
    assert ours.vocab_size == len(theirs)
    assert ours.get_vocab() == theirs.get_vocab()
    ids = theirs("The quick brown fox jumped, unaffably!")["input_ids"]
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids)
    for name in ("pad_token_id", "cls_token_id", "sep_token_id", "mask_token_id", "unk_token_id"):
        assert getattr(ours, name) == getattr(theirs, name), name


# ---- construction, training, saving --------------------------------------------------------------
def test_from_dir_reads_tokenizer_config(minilm_dir, tmp_path):
    from_json = BertTokenizer.from_dir(minilm_dir)
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "model_max_length": 128}))
    cased = BertTokenizer.from_dir(tmp_path)  # no tokenizer.json: vocab.txt + config
    assert from_json.do_lower_case and from_json.model_max_length == 512
    assert not cased.do_lower_case and cased.model_max_length == 128
    assert cased.encode_batch(["Hello"])[0].tokens != from_json.encode_batch(["Hello"])[0].tokens


def test_tokenizer_json_truncation_and_padding_are_switched_off(minilm_dir):
    # MiniLM's tokenizer.json asks for truncation and padding to 128; the wrapper must not apply them.
    tokenizer = BertTokenizer.from_dir(minilm_dir)
    encoding = tokenizer.encode_batch(["word " * 300])[0]
    assert len(encoding.ids) == 302
    assert len(tokenizer.encode_batch(["short"])[0].ids) == 3


def test_train_save_load_round_trip(data_dir, tmp_path, transformers):
    corpus = tmp_path / "corpus.txt"
    with open(data_dir / "wikitext-2-raw" / "wiki.test.raw", encoding="utf-8") as f:
        corpus.write_text("".join(line for _, line in zip(range(1500), f)), encoding="utf-8")
    trained = BertTokenizer.train([corpus], vocab_size=1200, min_frequency=2, show_progress=False)
    assert [trained.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
    assert 500 < trained.vocab_size <= 1200
    assert any(token.startswith("##") for token in trained.get_vocab())

    saved = tmp_path / "tok"
    trained.save(saved)
    assert {p.name for p in saved.iterdir()} >= {
        "vocab.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    texts = ["The game began development in 2010.", "Robert Boulter is an English actor."]
    reloaded = BertTokenizer.from_dir(saved)
    theirs = transformers.BertTokenizerFast.from_pretrained(str(saved))
    ids = [list(e.ids) for e in trained.encode_batch(texts)]
    assert ids == [list(e.ids) for e in reloaded.encode_batch(texts)]
    assert ids == theirs(texts)["input_ids"]
    assert ids[0][0] == trained.cls_token_id and ids[0][-1] == trained.sep_token_id

    (saved / "tokenizer.json").unlink()  # the vocab.txt alone must give the same tokenizer
    assert ids == [list(e.ids) for e in BertTokenizer.from_dir(saved).encode_batch(texts)]
    assert ids == transformers.BertTokenizerFast.from_pretrained(str(saved))(texts)["input_ids"]


# ---- small contracts ---------------------------------------------------------------------------
def test_input_too_long_names_the_limit():
    error = InputTooLong(3, 812, 512)
    assert isinstance(error, ValueError)
    assert (error.index, error.length, error.limit) == (3, 812, 512)
    assert str(error) == 'input 3 has 812 tokens; the model accepts at most 512 (send "truncate": true to cut it)'


def test_encode_batch_rejects_unknown_truncation(minilm_dir):
    tokenizer = BertTokenizer.from_dir(minilm_dir)
    with pytest.raises(ValueError, match="truncation"):
        tokenizer.encode_batch(["x"], truncation="middle")
    with pytest.raises(ValueError, match="pairs"):
        tokenizer.encode_batch(["x", "y"], ["only one"])


def test_truncation_does_not_stick_to_the_shared_backend(minilm_dir):
    tokenizer = BertTokenizer.from_dir(minilm_dir)
    assert len(tokenizer.encode_batch(["a b c d e f"], max_length=4, truncation=True)[0].ids) == 4
    assert len(tokenizer.encode_batch(["a b c d e f"])[0].ids) == 8


def test_pickles_and_threads_do_not_share_truncation(minilm_dir):
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    tokenizer = pickle.loads(pickle.dumps(BertTokenizer.from_dir(minilm_dir)))
    text = "a b c d e f g h"

    def encode(truncate: bool) -> int:
        kwargs = {"max_length": 4, "truncation": True} if truncate else {}
        return len(tokenizer.encode_batch([text] * 50, **kwargs)[0].ids)

    with ThreadPoolExecutor(4) as pool:
        lengths = list(pool.map(encode, [True, False] * 40))
    assert lengths == [4, 10] * 40


def test_small_batches_encoded_one_by_one_equal_the_batched_path(minilm_dir, squad_examples):
    """Up to SERIAL_ENCODE_MAX inputs skip tokenizers' thread pool; the encodings must not change."""
    from bert import tokenizer as T

    tok = T.BertTokenizer.from_dir(minilm_dir)
    pairs = squad_examples[: T.SERIAL_ENCODE_MAX]
    questions, contexts = [q for q, _ in pairs], [c for _, c in pairs]
    cases = [
        dict(texts=questions),
        dict(texts=questions, pairs=contexts),
        dict(texts=questions, pairs=contexts, max_length=96, truncation="only_second", stride=32),
        dict(texts=[q.split() for q in questions], is_split_into_words=True),
    ]
    for case in cases:
        small = tok.encode_batch(**case)
        padded = {k: (v + v[:1] if k in ("texts", "pairs") else v) for k, v in case.items()}  # one more: batched
        large = tok.encode_batch(**padded)[: len(small)]
        for a, b in zip(small, large):
            assert (a.ids, a.type_ids, a.offsets) == (b.ids, b.type_ids, b.offsets)
            assert [o.ids for o in a.overflowing] == [o.ids for o in b.overflowing]


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_plain_ascii_path_equals_the_normalizing_path(data_dir, do_lower_case):
    """Printable ASCII skips BertNormalizer (lowercased in Python instead); every text at the edges of that path
    (typed specials in either case, tabs, control characters, accents, pairs) encodes as the full pipeline does."""
    tok = BertTokenizer.from_vocab(data_dir / "bert-vocab" / "vocab.txt", do_lower_case=do_lower_case)
    assert tok._plain is not None  # the path under test is on
    texts = [
        "It's A Gripping, Well-Acted FILM -- e.g. 3.14 U.S.A.!",
        "Hello [MASK] world",
        "hello [mask] WORLD [Mask]",
        "[CLS] in the text [SEP]",
        "tab\tnew\nline\rreturn",
        "del\x7fand\x00nul",
        "Café déjà vu",
        "  spaced   out  ",
        "",
        " ",
    ]
    pairs = texts[::-1]

    def fields(e):
        return (e.ids, e.type_ids, e.tokens, e.offsets, e.word_ids, e.special_tokens_mask, e.sequence_ids)

    backend = tok.backend
    for i, text in enumerate(texts):
        assert fields(tok.encode_batch([text])[0]) == fields(backend.encode(text)), text
        assert fields(tok.encode_batch([text], [pairs[i]])[0]) == fields(backend.encode(text, pairs[i])), text
    many = texts * 2  # more than SERIAL_ENCODE_MAX: tokenizers' batch path
    assert [fields(e) for e in tok.encode_batch(many)] == [fields(backend.encode(t)) for t in many]


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_encode_ids_equals_the_encodings(data_dir, sst2_dev, do_lower_case):
    """encode_ids (whole words by one lookup, the rest by WordPiece's loop in Python) gives the encodings' ids and
    type ids on SST-2, on words split into pieces or too long for one, and gives None where the full path is
    needed (added tokens typed in either case, non-ASCII, control characters)."""
    tok = BertTokenizer.from_vocab(data_dir / "bert-vocab" / "vocab.txt", do_lower_case=do_lower_case)
    texts = [sentence for sentence, _ in sst2_dev if sentence.isascii()] + [
        "Unbelievablenessly xqzzy's re-re-remade FILM -- e.g. 3.14 U.S.A.!!! ~`^|{}",
        "a" * 100 + " " + "b" * 101 + " antidisestablishmentarianism",
        "  spaced   out  ",
        "hello [mask] world",  # not the added token: BertNormalizer does not lowercase it into one either
        "",
    ]
    got = tok.encode_ids(texts)
    assert [(e.ids, e.type_ids) for e in tok.encode_batch(texts)] == got
    assert len(texts) > 860 and sum(len(ids) for ids, _ in got) > 10 * len(texts)
    for text in ("Hello [MASK] world", "[CLS] x", "Café", "tab\there", "nul\x00"):
        assert tok.encode_ids(["fine", text]) is None, text
