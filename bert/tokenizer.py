"""BERT-family tokenizers: a thin, torch-free wrapper over Hugging Face `tokenizers`.

Token ids and character offsets are identical to transformers' fast tokenizers: from vocab.txt, the same
normalizer, pre-tokenizer, WordPiece model and `[CLS] A [SEP] B [SEP]` template as `BertTokenizerFast`; from
a tokenizer.json, whatever model and template it holds (WordPiece, RoBERTa's byte-level BPE with
`<s> A </s></s> B </s>`, XLM-R's Unigram), with the special tokens its tokenizer_config.json names.
The wrapper never truncates or pads behind the caller's back (a `tokenizer.json` saved with
truncation or padding settings has them switched off on load); the task codecs in `bert.tasks`
decide what happens to long inputs.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Encoding, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer

from .errors import BadInput, one_line, read_json_object

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# Order matters for `train`: BERT's own vocabularies start [PAD]=0; the rest of the specials follow.
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
DEFAULT_MODEL_MAX_LENGTH = 512
# transformers writes a huge sentinel (int(1e30)) when a tokenizer has no length limit.
_NO_LIMIT_SENTINEL = 10**12

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


class InputTooLong(ValueError):
    """An input has more tokens than the model accepts and the caller did not ask to truncate it."""

    def __init__(self, index: int, length: int | None, limit: int, what: str | None = None):
        self.index = index
        self.length = length  # None: more than `limit`, not counted further (a huge input is never tokenised whole)
        self.limit = limit
        self.what = what  # what is too long, when not the input itself ("the query")
        has = f"more than {limit}" if length is None else str(length)
        super().__init__(
            f"{what or f'input {index}'} has {has} tokens; the model accepts at most {limit} "
            '(send "truncate": true to cut it)'
        )

    def __reduce__(self):  # keep the exception picklable across process pools
        return (type(self), (self.index, self.length, self.limit, self.what))


class TokenizerError(BadInput, ValueError):
    """Tokenizer files that cannot be read, or that lack what BERT needs; the message names the file."""


def _read_json(path: Path) -> dict:
    """The JSON object in `path`; {} when there is no such file."""
    return read_json_object(path, TokenizerError) or {}


def _read_vocab(vocab_file) -> dict[str, int]:
    # Like transformers' load_vocab: one token per line, the id is the line number.
    try:
        with open(vocab_file, encoding="utf-8") as f:
            return {line.rstrip("\n"): index for index, line in enumerate(f)}
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{vocab_file} is not UTF-8 text (byte {e.start}), so not a vocab.txt") from None
    except OSError as e:
        raise TokenizerError(f"{vocab_file} cannot be read: {e.strerror or e}") from None


def _bert_pipeline(
    tokenizer: Tokenizer, *, do_lower_case: bool, strip_accents: bool | None, tokenize_chinese_chars: bool
) -> Tokenizer:
    """Attach BERT's normalizer, pre-tokenizer, template and decoder (as transformers' BertTokenizer does)."""
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=tokenize_chinese_chars,
        strip_accents=strip_accents,
        lowercase=do_lower_case,
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    # Specials present in the vocab become added tokens, so "[MASK]" typed in a text stays one token.
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is not None]
    )
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    if cls_id is None or sep_id is None:
        raise ValueError(f"vocabulary lacks {CLS} or {SEP}")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    return tokenizer


def _normalizer_options(tokenizer: Tokenizer) -> dict:
    """Read do_lower_case & co. back from a tokenizer.json's BertNormalizer (absent keys: BERT defaults)."""
    state = json.loads(tokenizer.to_str()).get("normalizer") or {}
    if state.get("type") == "Sequence":  # a BertNormalizer wrapped in a Sequence
        state = next((n for n in state.get("normalizers", []) if n.get("type") == "BertNormalizer"), {})
    return {
        "do_lower_case": bool(state.get("lowercase", True)),
        "strip_accents": state.get("strip_accents"),
        "tokenize_chinese_chars": bool(state.get("handle_chinese_chars", True)),
    }


SPECIAL_ROLES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
BERT_SPECIALS = dict(zip(SPECIAL_ROLES, SPECIAL_TOKENS))


def _special_names(directory: Path) -> dict[str, str]:
    """role -> token text, as tokenizer_config.json (or special_tokens_map.json) names them; BERT's by default.
    RoBERTa's <s>/</s> serve as its [CLS]/[SEP] (its bos/eos)."""
    names = dict(BERT_SPECIALS)
    for file in ("special_tokens_map.json", "tokenizer_config.json"):
        config = _read_json(directory / file)
        for role in SPECIAL_ROLES:
            value = config.get(role)
            if isinstance(value, dict):  # an AddedToken written out: {"content": "<s>", ...}
                value = value.get("content")
            if isinstance(value, str) and value:
                names[role] = value
    return names


def _model_max_length(value) -> int:
    if value is None or int(value) >= _NO_LIMIT_SENTINEL:
        return DEFAULT_MODEL_MAX_LENGTH
    return int(value)


def _tokenizer_settings(path: Path) -> dict:
    """from_vocab's keyword arguments from a tokenizer_config.json (absent file or keys: BERT's defaults),
    each checked for its type, so that a wrong one is an error naming the file, not one inside tokenizers."""
    config = _read_json(path)
    settings = {
        "do_lower_case": config.get("do_lower_case", True),
        "strip_accents": config.get("strip_accents"),
        "tokenize_chinese_chars": config.get("tokenize_chinese_chars", True),
    }
    for name, value in settings.items():
        if not (isinstance(value, bool) or (name == "strip_accents" and value is None)):
            raise TokenizerError(f"{path}: {name} must be true or false, got {value!r:.60}")
    max_length = config.get("model_max_length")
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, (int, float)) or not 0 < max_length < float("inf")
    ):
        raise TokenizerError(f"{path}: model_max_length must be a positive number, got {max_length!r:.60}")
    settings["model_max_length"] = _model_max_length(max_length)
    return settings


# Up to this many inputs are encoded one by one in the calling thread. tokenizers' encode_batch hands even
# one input to its rayon pool, whose threads then spin on CPU a server needs (measured: docs/serving.md,
# "Why it is built this way").
SERIAL_ENCODE_MAX = 8


def _plain_text_path(tokenizer: Tokenizer) -> tuple[Tokenizer, bool, tuple[str, ...]] | None:
    """(a copy of `tokenizer` without its normalizer, whether to lowercase, the added tokens matched on raw text)
    when the normalizer is BERT's own; None otherwise.

    On printable ASCII text BertNormalizer only lowercases (when it does): nothing for clean_text to drop or turn
    into a space, no accents to strip, no CJK characters to space out, and every character stays one character,
    so `str.lower()` and this copy give the same ids, tokens and offsets in less time (the normalizer's
    alignment bookkeeping is about a third of `encode`)."""
    state = json.loads(tokenizer.to_str()).get("normalizer")
    if not isinstance(state, dict) or state.get("type") != "BertNormalizer":
        return None
    plain = Tokenizer.from_str(tokenizer.to_str())
    plain.normalizer = None
    # A text holding an added token that is matched before normalizing ("[MASK]") takes the full path: its
    # lowercased copy would no longer match it.
    raw_added = tuple(t.content for t in tokenizer.get_added_tokens_decoder().values() if not t.normalized)
    return plain, bool(state.get("lowercase", True)), raw_added


def _plain_inputs(inputs: list, lower: bool, raw_added: tuple[str, ...]) -> list | None:
    """`inputs` (texts or (text, pair) tuples) as the plain-text path takes them, or None if any is not
    printable ASCII free of raw-matched added tokens."""
    out = []
    for x in inputs:
        parts = x if isinstance(x, tuple) else (x,)
        ready = []
        for text in parts:
            if not (isinstance(text, str) and text.isascii() and text.isprintable()):
                return None
            low = text.lower() if lower else text
            if any(t in text or t in low for t in raw_added):
                return None
            ready.append(low)
        out.append(tuple(ready) if isinstance(x, tuple) else ready[0])
    return out


# Printable ASCII splits, as BertPreTokenizer splits it, into runs of letters and digits and single punctuation
# characters; the space (its only white space) separates them and is dropped.
_PLAIN_WORDS = re.compile(r"[0-9A-Za-z]+|[^ 0-9A-Za-z]").findall


class _PlainIds:
    """Ids of printable ASCII texts, the same as the WordPiece tokenizer's, in Python: most words are one
    vocabulary entry, found by one dict lookup (WordPiece's longest match from the start is the whole word when
    it is in the vocabulary); the rest are split by WordPiece's own greedy longest-match loop. Costs a fraction
    of `Tokenizer.encode` on a short text, which also builds offsets and tokens a classifier does not read."""

    def __init__(self, tokenizer: Tokenizer, lower: bool):
        model = tokenizer.model
        self.vocab = tokenizer.get_vocab(with_added_tokens=False)
        self.unk = self.vocab[model.unk_token]
        self.prefix = model.continuing_subword_prefix
        self.max_chars = model.max_input_chars_per_word
        self.lower = lower
        # Any added token, matched on the text before the model sees it, sends a text to the full path.
        self.added = tuple(t.content for t in tokenizer.get_added_tokens_decoder().values())
        encoding = tokenizer.encode(["a"], is_pretokenized=True)
        where = encoding.sequence_ids.index(0)
        self.before, self.after = encoding.ids[:where], encoding.ids[where + 1 :]
        self.type_id = encoding.type_ids[0]
        if encoding.type_ids != [self.type_id] * len(encoding.ids):
            raise ValueError("the template gives a single text more than one token type")

    def pieces(self, word: str, out: list) -> None:
        """WordPiece's greedy longest match (tokenizers' WordPiece::tokenize) of a word not in the vocabulary."""
        n = len(word)
        if n > self.max_chars:
            out.append(self.unk)
            return
        get, found, start = self.vocab.get, [], 0
        while start < n:
            end = n
            while start < end:
                i = get(word[start:end] if start == 0 else self.prefix + word[start:end])
                if i is not None:
                    break
                end -= 1
            else:
                out.append(self.unk)
                return
            found.append(i)
            start = end
        out.extend(found)

    def __call__(self, texts: list) -> list[tuple[list[int], list[int]]] | None:
        """[(ids, type ids)] per text, or None if any is not printable ASCII free of added tokens."""
        get, max_chars, out = self.vocab.get, self.max_chars, []
        for text in texts:
            if not (isinstance(text, str) and text.isascii() and text.isprintable()):
                return None
            low = text.lower() if self.lower else text
            for t in self.added:
                if t in text or t in low:
                    return None
            ids = self.before.copy()
            for word in _PLAIN_WORDS(low):
                i = get(word)
                if i is None or len(word) > max_chars:
                    self.pieces(word, ids)
                else:
                    ids.append(i)
            ids += self.after
            out.append((ids, [self.type_id] * len(ids)))
        return out


def _plain_ids(tokenizer: Tokenizer, plain: tuple | None) -> _PlainIds | None:
    """The Python path for `tokenizer` when it is BERT's own (normalizer, pre-tokenizer and WordPiece model)."""
    if plain is None:
        return None
    state = json.loads(tokenizer.to_str())
    if (state.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer" or state["model"].get(
        "type"
    ) != "WordPiece":
        return None
    try:
        return _PlainIds(tokenizer, plain[1])
    except (KeyError, ValueError):  # no [UNK] in the vocabulary, or a template this path does not follow
        return None


def _encode_many(tokenizer: Tokenizer, inputs: list, pretokenized: bool, add_special_tokens: bool) -> list[Encoding]:
    if len(inputs) > SERIAL_ENCODE_MAX:
        return tokenizer.encode_batch(inputs, is_pretokenized=pretokenized, add_special_tokens=add_special_tokens)
    return [
        tokenizer.encode(
            *(x if isinstance(x, tuple) else (x,)), is_pretokenized=pretokenized, add_special_tokens=add_special_tokens
        )
        for x in inputs
    ]


class BertTokenizer:
    """WordPiece tokenizer with BERT's special tokens, offsets and pair template."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
        specials: dict[str, str] | None = None,
    ):
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        # Truncation is a setting of a tokenizers.Tokenizer, not an argument of encode. Calls that
        # truncate use their own copy under a lock, so a thread encoding without truncation on the
        # main backend never sees another thread's setting.
        self._truncating: Tokenizer | None = None
        self._truncating_lock = threading.Lock()
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = _model_max_length(model_max_length)
        self.specials = {**BERT_SPECIALS, **(specials or {})}  # role ("cls_token") -> its text ("[CLS]", "<s>")
        for role in ("pad_token", "unk_token", "cls_token", "sep_token"):
            if tokenizer.token_to_id(self.specials[role]) is None:
                raise ValueError(f"vocabulary lacks the special token {self.specials[role]}")
        self._pair_template: tuple | None = None
        self._plain = _plain_text_path(tokenizer)
        self._plain_ids = _plain_ids(tokenizer, self._plain)

    def __getstate__(self) -> dict:  # picklable (DataLoader workers, process pools): drop the lock & copy
        state = dict(self.__dict__)
        state["_truncating"], state["_truncating_lock"] = None, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._truncating_lock = threading.Lock()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path) -> "BertTokenizer":
        """Load from a checkpoint/artifact dir: tokenizer.json if present, else vocab.txt + tokenizer_config.json."""
        path = Path(path)
        settings = _tokenizer_settings(path / "tokenizer_config.json")
        if (path / "tokenizer.json").is_file():
            source = path / "tokenizer.json"
            try:
                tokenizer = Tokenizer.from_file(str(source))
                options = _normalizer_options(tokenizer)
                return cls(
                    tokenizer, model_max_length=settings["model_max_length"], specials=_special_names(path), **options
                )
            except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception for a file it cannot parse
                raise TokenizerError(f"{source} is not a usable BERT tokenizer: {one_line(e, 300)}") from None
        if not (path / "vocab.txt").is_file():
            raise TokenizerError(f"{path} has neither tokenizer.json nor vocab.txt")
        return cls.from_vocab(path / "vocab.txt", **settings)

    @classmethod
    def from_vocab(
        cls,
        vocab_file,
        *,
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
    ) -> "BertTokenizer":
        """Build from a BERT vocab.txt, exactly as transformers' BertTokenizerFast does."""
        model = WordPiece(_read_vocab(vocab_file), unk_token=UNK, max_input_chars_per_word=100)
        try:
            tokenizer = _bert_pipeline(
                Tokenizer(model),
                do_lower_case=do_lower_case,
                strip_accents=strip_accents,
                tokenize_chinese_chars=tokenize_chinese_chars,
            )
            return cls(
                tokenizer,
                do_lower_case=do_lower_case,
                strip_accents=strip_accents,
                tokenize_chinese_chars=tokenize_chinese_chars,
                model_max_length=model_max_length,
            )
        except ValueError as e:  # a vocabulary without BERT's special tokens
            raise TokenizerError(f"{vocab_file} is not a BERT vocabulary: {e}") from None

    @classmethod
    def train(
        cls,
        files: Iterable[str | os.PathLike],
        *,
        vocab_size: int = 30522,
        do_lower_case: bool = True,
        min_frequency: int = 2,
        show_progress: bool = True,
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
    ) -> "BertTokenizer":
        """Learn a new WordPiece vocabulary from text files; ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]."""
        tokenizer = Tokenizer(WordPiece(unk_token=UNK, max_input_chars_per_word=100))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=do_lower_case, strip_accents=None)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            continuing_subword_prefix="##",
            show_progress=show_progress,
        )
        tokenizer.train([str(f) for f in files], trainer)
        tokenizer = _bert_pipeline(
            tokenizer, do_lower_case=do_lower_case, strip_accents=None, tokenize_chinese_chars=True
        )
        return cls(tokenizer, do_lower_case=do_lower_case, model_max_length=model_max_length)

    def save(self, path) -> None:
        """Write vocab.txt, tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        wordpiece = isinstance(self._tokenizer.model, WordPiece)
        if wordpiece:  # vocab.txt is WordPiece's; the others live in tokenizer.json alone
            by_id = sorted(self.get_vocab().items(), key=lambda item: item[1])
            if [index for _, index in by_id] != list(range(len(by_id))):
                raise ValueError("vocabulary ids are not contiguous; cannot write vocab.txt")
            with open(path / "vocab.txt", "w", encoding="utf-8") as f:
                f.writelines(token + "\n" for token, _ in by_id)
        self._tokenizer.save(str(path / "tokenizer.json"))
        special_tokens = {
            role: token for role, token in self.specials.items() if self._tokenizer.token_to_id(token) is not None
        }
        config = {
            "tokenizer_class": "BertTokenizer" if wordpiece else "PreTrainedTokenizerFast",
            "do_lower_case": self.do_lower_case,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "do_basic_tokenize": True,
            "model_max_length": self.model_max_length,
            **special_tokens,
        }
        for name, content in (("tokenizer_config.json", config), ("special_tokens_map.json", special_tokens)):
            with open(path / name, "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2, ensure_ascii=False)
                f.write("\n")

    # ---- vocabulary ---------------------------------------------------------------------
    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (truncation and padding off)."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    @property
    def pad_token_id(self) -> int:
        return self._tokenizer.token_to_id(self.specials["pad_token"])

    @property
    def cls_token_id(self) -> int:
        return self._tokenizer.token_to_id(self.specials["cls_token"])

    @property
    def sep_token_id(self) -> int:
        return self._tokenizer.token_to_id(self.specials["sep_token"])

    @property
    def mask_token_id(self) -> int | None:
        return self._tokenizer.token_to_id(self.specials["mask_token"])

    @property
    def unk_token_id(self) -> int:
        return self._tokenizer.token_to_id(self.specials["unk_token"])

    @property
    def unk_token(self) -> str:
        return self.specials["unk_token"]

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in (self.token_to_id(t) for t in self.specials.values()) if i is not None]

    @property
    def pair_template(self) -> tuple[list[int], list[int], list[int], int]:
        """How the post-processor wraps a pair: (ids before A, ids between A and B, ids after B, B's token type):
        ([CLS], [SEP], [SEP], 1) for BERT, (<s>, </s></s>, </s>, 0) for RoBERTa. For code that assembles pairs
        from pieces (QA windows); read once from the template itself."""
        if self._pair_template is None:
            encoding = self._tokenizer.encode(["a"], ["b"], is_pretokenized=True)
            sequence = encoding.sequence_ids
            ids, types = encoding.ids, encoding.type_ids
            first_a = sequence.index(0)
            last_a = len(sequence) - 1 - sequence[::-1].index(0)
            first_b = sequence.index(1)
            last_b = len(sequence) - 1 - sequence[::-1].index(1)
            self._pair_template = (
                list(ids[:first_a]),
                list(ids[last_a + 1 : first_b]),
                list(ids[last_b + 1 :]),
                int(types[first_b]),
            )
        return self._pair_template

    def convert_ids_to_tokens(self, ids) -> list[str]:
        if isinstance(ids, (int, np.integer)):
            ids = [ids]
        return [self._tokenizer.id_to_token(int(i)) for i in ids]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ---- encoding -----------------------------------------------------------------------
    def encode_batch(
        self,
        texts: list[str],
        pairs: list[str] | None = None,
        *,
        max_length: int | None = None,
        truncation: bool | str = False,
        stride: int = 0,
        return_overflowing: bool = False,
        add_special_tokens: bool = True,
        is_split_into_words: bool = False,
    ) -> list[Encoding]:
        """Unpadded encodings. With `return_overflowing` the cut-off windows stay in `encoding.overflowing`.

        `truncation` is False, True (= "longest_first"), "longest_first", "only_first" or "only_second";
        it needs `max_length` (default: model_max_length). Without truncation nothing is cut, whatever the length.
        With `is_split_into_words`, each text is a list of words (transformers' semantics).
        """
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a list of texts")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        strategy = _truncation_strategy(truncation)
        inputs = list(texts) if pairs is None else list(zip(texts, pairs))
        if strategy is None:
            if self._plain is not None and not is_split_into_words:
                plain, lower, raw_added = self._plain
                ready = _plain_inputs(inputs, lower, raw_added)
                if ready is not None:
                    return _encode_many(plain, ready, False, add_special_tokens)
            return _encode_many(self._tokenizer, inputs, is_split_into_words, add_special_tokens)
        if max_length is None:
            max_length = self.model_max_length
        with self._truncating_lock:
            if self._truncating is None:
                self._truncating = Tokenizer.from_str(self._tokenizer.to_str())
            self._truncating.enable_truncation(max_length, stride=stride, strategy=strategy)
            encodings = _encode_many(self._truncating, inputs, is_split_into_words, add_special_tokens)
        # tokenizers always computes the overflow windows; `return_overflowing` only says that the
        # caller will read them (they stay in `encoding.overflowing`; the first window is the encoding).
        del return_overflowing
        return encodings

    def encode_ids(self, texts: list[str]) -> list[tuple[list[int], list[int]]] | None:
        """[(input ids, token type ids)] of single texts, with special tokens and without truncation: what
        encode_batch's encodings hold, when every text is printable ASCII free of added tokens; else None."""
        return None if self._plain_ids is None else self._plain_ids(texts)

    def __call__(
        self,
        texts: str | list[str],
        pairs: str | list[str] | None = None,
        *,
        max_length: int | None = None,
        truncation: bool | str = False,
        padding: bool = True,
    ) -> dict[str, np.ndarray]:
        """Encode and pad to the longest: input_ids, attention_mask, token_type_ids, special_tokens_mask
        (int64, (B, T)) and offset_mapping (int64, (B, T, 2)). Padding: [PAD] ids, mask 0, special 1."""
        if isinstance(texts, str):
            texts = [texts]
            pairs = [pairs] if isinstance(pairs, str) else pairs
        encodings = self.encode_batch(texts, pairs, max_length=max_length, truncation=truncation)
        lengths = [len(e.ids) for e in encodings]
        if not padding and len(set(lengths)) > 1:
            raise ValueError("inputs have different lengths; use padding=True")
        width = max(lengths, default=0)
        batch = {
            "input_ids": np.full((len(encodings), width), self.pad_token_id, dtype=np.int64),
            "attention_mask": np.zeros((len(encodings), width), dtype=np.int64),
            "token_type_ids": np.zeros((len(encodings), width), dtype=np.int64),
            # As in transformers, padding counts as special.
            "special_tokens_mask": np.ones((len(encodings), width), dtype=np.int64),
            "offset_mapping": np.zeros((len(encodings), width, 2), dtype=np.int64),
        }
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            batch["input_ids"][row, :n] = encoding.ids
            batch["attention_mask"][row, :n] = encoding.attention_mask
            batch["token_type_ids"][row, :n] = encoding.type_ids
            batch["special_tokens_mask"][row, :n] = encoding.special_tokens_mask
            if n:
                batch["offset_mapping"][row, :n] = encoding.offsets
        return batch

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case}, "
            f"model_max_length={self.model_max_length})"
        )


def _truncation_strategy(truncation: bool | str) -> str | None:
    if truncation is False or truncation is None:
        return None
    if truncation is True:
        return "longest_first"
    if truncation in TRUNCATION_STRATEGIES:
        return truncation
    raise ValueError(f"truncation must be a bool or one of {TRUNCATION_STRATEGIES}, got {truncation!r}")
