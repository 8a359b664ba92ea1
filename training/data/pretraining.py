"""Pretraining data: corpus -> NSP sentence pairs in sharded numpy files -> dynamically masked batches.

Corpus format (BERT's): one sentence per line, a blank line between documents; UTF-8 with or
without BOM, LF or CRLF. Documents are read as a stream and turned into instances a buffer of
documents at a time (the "random other document" of NotNext pairs comes from the same buffer), so
neither the corpus nor corpus x dupe_factor is ever held in memory. Instances are static (written
once per dupe); masks are drawn at batch time from a per-batch RNG, so every epoch sees new masks.

Every random choice goes through one `random.Random` (instances) or `numpy.random.Generator`
(masks) that the caller passes in; the functions themselves are pure.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert.tasks.common import open_text

IGNORE_INDEX = -100
INDEX_NAME = "index.json"


# ----------------------------------------------------------------------------- corpus


def read_documents(paths: Iterable) -> Iterator[list[str]]:
    """Documents (lists of sentences) from corpus files; blank lines separate documents, and a new
    file starts a new document. Whitespace-only lines count as blank; CRLF and BOM are tolerated."""
    for path in paths:
        document: list[str] = []
        with open_text(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    document.append(line)
                elif document:
                    yield document
                    document = []
        if document:
            yield document


def tokenize_documents(documents: Iterable[list[str]], tokenizer, batch: int = 256) -> Iterator[list[list[int]]]:
    """Each document as WordPiece ids per sentence (no special tokens); empty sentences dropped."""
    for document in documents:
        ids = []
        for start in range(0, len(document), batch):
            encodings = tokenizer.encode_batch(document[start : start + batch], add_special_tokens=False)
            ids.extend(list(e.ids) for e in encodings if len(e.ids))
        if ids:
            yield ids


# ----------------------------------------------------------------------------- NSP instances


@dataclass
class Instance:
    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool  # NSP label 1 = NotNext (B from another document), 0 = IsNext


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer segment, from its front or back at random, until both fit (google's rule)."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc) >= 1
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def instances_from_document(
    documents: Sequence[list[list[int]]],
    doc_index: int,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    nsp: bool = True,
) -> list[Instance]:
    """Google's create_instances_from_document, with one change: IsNext/NotNext is decided first
    (50/50), and an IsNext pair whose chunk holds a single segment splits that segment, so the NSP
    labels stay balanced even for documents of long lines. NotNext needs another document in `documents`."""
    document = documents[doc_index]
    max_num_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    chunk: list[list[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            random_next = nsp and len(documents) > 1 and rng.random() < 0.5
            if random_next:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                tokens_a = [t for segment in chunk[:a_end] for t in segment]
                target_b_length = max(1, target_seq_length - len(tokens_a))
                other = doc_index
                for _ in range(10):
                    other = rng.randint(0, len(documents) - 1)
                    if other != doc_index:
                        break
                if other == doc_index:  # pathological: nothing else to pair with
                    other = (doc_index + 1) % len(documents)
                random_document = documents[other]
                tokens_b = []
                for segment in random_document[rng.randint(0, len(random_document) - 1) :]:
                    tokens_b.extend(segment)
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(chunk) - a_end  # the unused segments go back into the stream
            else:
                if len(chunk) >= 2:
                    a_end = rng.randint(1, len(chunk) - 1)
                    tokens_a = [t for segment in chunk[:a_end] for t in segment]
                    tokens_b = [t for segment in chunk[a_end:] for t in segment]
                else:  # one long segment: A and B are its two adjacent halves
                    segment = chunk[0][:max_num_tokens]
                    if len(segment) < 2:
                        tokens_a, tokens_b = [], []
                    else:
                        cut = rng.randint(1, len(segment) - 1)
                        tokens_a, tokens_b = list(segment[:cut]), list(segment[cut:])
            if tokens_a and tokens_b:
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                instances.append(Instance(tokens_a, tokens_b, random_next))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def instance_arrays(instance: Instance, cls_id: int, sep_id: int) -> tuple[list[int], int]:
    """[CLS] A [SEP] B [SEP] ids and the length of segment 0 ([CLS] A [SEP])."""
    ids = [cls_id, *instance.tokens_a, sep_id, *instance.tokens_b, sep_id]
    return ids, len(instance.tokens_a) + 2


# ----------------------------------------------------------------------------- shards on disk


class ShardWriter:
    """Appends instances and writes a shard (four .npy files) every `per_shard` instances."""

    def __init__(self, directory: Path, per_shard: int, id_dtype=np.int32):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.per_shard = per_shard
        self.id_dtype = id_dtype
        self.shards: list[dict] = []
        self._reset()

    def _reset(self):
        self.ids: list[int] = []
        self.offsets: list[int] = [0]
        self.a_lengths: list[int] = []
        self.nsp: list[int] = []

    def add(self, ids: list[int], a_length: int, is_random_next: bool) -> None:
        self.ids.extend(ids)
        self.offsets.append(len(self.ids))
        self.a_lengths.append(a_length)
        self.nsp.append(int(is_random_next))
        if len(self.nsp) >= self.per_shard:
            self.flush()

    def flush(self) -> None:
        if not self.nsp:
            return
        name = f"shard-{len(self.shards):05d}"
        np.save(self.directory / f"{name}.ids.npy", np.asarray(self.ids, dtype=self.id_dtype))
        np.save(self.directory / f"{name}.offsets.npy", np.asarray(self.offsets, dtype=np.int64))
        np.save(self.directory / f"{name}.a_lengths.npy", np.asarray(self.a_lengths, dtype=np.int16))
        np.save(self.directory / f"{name}.nsp.npy", np.asarray(self.nsp, dtype=np.int8))
        self.shards.append({"name": name, "instances": len(self.nsp), "tokens": len(self.ids)})
        self._reset()


def corpus_files(corpus: Sequence) -> list[list[int]]:
    """Each corpus file's size and modification time (ns): what index.json records of the files the shards were
    made from, so that shards of a corpus since rewritten at the same path are not reused."""
    return [[(stat := Path(p).stat()).st_size, stat.st_mtime_ns] for p in corpus]


def stable_heldout(document: list[str], percent: float) -> bool:
    """Whether a document is held out: a stable hash of its first line, so the split never depends
    on order, seed or dupe factor."""
    if percent <= 0:
        return False
    return zlib.crc32(document[0].encode("utf-8")) % 10000 < percent * 100


def create_pretraining_data(
    corpus: Sequence,
    tokenizer,
    out_dir: Path,
    *,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 5,
    nsp: bool = True,
    heldout_percent: float = 0.0,
    seed: int = 12345,
    documents_per_buffer: int = 2000,
    instances_per_shard: int = 20000,
) -> dict:
    """Stream the corpus dupe_factor times into train/ (and heldout/, one dupe) shards; writes index.json.

    index.json is what says the shards are whole and which settings made them (a later run reuses them when the
    settings match): an earlier build's index is removed before any shard is rewritten, and the new one is
    written (atomically) only after the last shard, so a build that stops halfway leaves no index that
    describes shards it had begun to overwrite."""
    from bert.atomic import write_file_atomic

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / INDEX_NAME).unlink(missing_ok=True)
    rng = random.Random(seed)
    id_dtype = np.uint16 if tokenizer.vocab_size <= 65535 else np.int32
    writers = {
        "train": ShardWriter(out_dir / "train", instances_per_shard, id_dtype),
        "heldout": ShardWriter(out_dir / "heldout", instances_per_shard, id_dtype),
    }
    counts = {
        "train": {"documents": 0, "instances": 0, "not_next": 0},
        "heldout": {"documents": 0, "instances": 0, "not_next": 0},
    }
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def emit(split: str, buffer: list[list[list[int]]]) -> None:
        order = list(range(len(buffer)))
        rng.shuffle(order)  # instance order within a buffer; batches are shuffled again per epoch
        for doc_index in order:
            for instance in instances_from_document(
                buffer, doc_index, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, rng=rng, nsp=nsp
            ):
                ids, a_length = instance_arrays(instance, cls_id, sep_id)
                writers[split].add(ids, a_length, instance.is_random_next)
                counts[split]["instances"] += 1
                counts[split]["not_next"] += int(instance.is_random_next)

    for dupe in range(dupe_factor):
        buffers: dict[str, list] = {"train": [], "heldout": []}
        raw = read_documents(corpus)
        for text_doc in raw:
            split = "heldout" if stable_heldout(text_doc, heldout_percent) else "train"
            if split == "heldout" and dupe > 0:
                continue  # one copy of held-out data is enough
            ids_doc = next(tokenize_documents([text_doc], tokenizer), None)
            if ids_doc is None:
                continue
            if dupe == 0:
                counts[split]["documents"] += 1
            buffers[split].append(ids_doc)
            if len(buffers[split]) >= documents_per_buffer:
                emit(split, buffers[split])
                buffers[split] = []
        for split, buffer in buffers.items():
            if buffer:
                emit(split, buffer)
    for writer in writers.values():
        writer.flush()
    index = {
        "max_seq_length": max_seq_length,
        "short_seq_prob": short_seq_prob,
        "dupe_factor": dupe_factor,
        "nsp": nsp,
        "heldout_percent": heldout_percent,
        "seed": seed,
        "vocab_size": tokenizer.vocab_size,
        "corpus": [str(p) for p in corpus],
        "corpus_files": corpus_files(corpus),
        "counts": counts,
        "shards": {split: w.shards for split, w in writers.items()},
    }
    write_file_atomic(out_dir / INDEX_NAME, json.dumps(index, indent=2) + "\n")
    return index


class PretrainingShards:
    """Read-only view of one split's shards (memory-mapped): instance i -> (ids, a_length, nsp label)."""

    def __init__(self, directory: Path, split: str = "train"):
        directory = Path(directory)
        self.index = json.loads((directory / INDEX_NAME).read_text())
        self.parts = []
        for shard in self.index["shards"][split]:
            base = directory / split / shard["name"]
            self.parts.append(
                tuple(np.load(f"{base}.{kind}.npy", mmap_mode="r") for kind in ("ids", "offsets", "a_lengths", "nsp"))
            )
        sizes = [len(p[3]) for p in self.parts]
        self.starts = np.cumsum([0] + sizes)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> tuple[np.ndarray, int, int]:
        shard = int(np.searchsorted(self.starts, i, side="right") - 1)
        ids, offsets, a_lengths, nsp = self.parts[shard]
        local = i - self.starts[shard]
        return (
            np.asarray(ids[offsets[local] : offsets[local + 1]], dtype=np.int64),
            int(a_lengths[local]),
            int(nsp[local]),
        )


# ----------------------------------------------------------------------------- masking


@dataclass
class MaskingConfig:
    mask_token_id: int
    vocab_size: int
    special_ids: tuple[int, ...]  # never chosen for prediction ([CLS], [SEP], [PAD], ...)
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_mask: bool = False
    continuation: np.ndarray | None = None  # bool per vocab id: a "##" piece (whole-word masking)

    def __post_init__(self):
        replaceable = np.ones(self.vocab_size, dtype=bool)
        replaceable[list(self.special_ids)] = False
        self.replacement_ids = np.flatnonzero(replaceable)  # random replacements are ordinary tokens


def continuation_flags(tokenizer) -> np.ndarray:
    flags = np.zeros(tokenizer.vocab_size, dtype=bool)
    for token, index in tokenizer.get_vocab().items():
        flags[index] = token.startswith("##")
    return flags


def mask_tokens(input_ids: np.ndarray, cfg: MaskingConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masked LM on one sequence: choose ~masked_lm_prob of the non-special tokens (at least 1,
    at most max_predictions_per_seq; whole words together with whole_word_mask); of the chosen, 80 %
    become [MASK], 10 % a random ordinary token, 10 % stay. Returns (masked ids, labels with
    IGNORE_INDEX everywhere but the chosen positions)."""
    input_ids = np.asarray(input_ids)
    special = np.isin(input_ids, cfg.special_ids)
    candidates = np.flatnonzero(~special)
    labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int64)
    if len(candidates) == 0:
        return input_ids.copy(), labels
    if cfg.whole_word_mask and cfg.continuation is not None:
        groups: list[list[int]] = []
        for position in candidates:
            if groups and cfg.continuation[input_ids[position]] and groups[-1][-1] == position - 1:
                groups[-1].append(int(position))
            else:
                groups.append([int(position)])
    else:
        groups = [[int(p)] for p in candidates]
    num_to_predict = min(cfg.max_predictions_per_seq, max(1, int(round(len(candidates) * cfg.masked_lm_prob))))
    chosen: list[int] = []
    for g in rng.permutation(len(groups)):
        group = groups[g]
        if len(chosen) >= num_to_predict:
            break
        if len(chosen) + len(group) > num_to_predict:
            continue  # a whole word that does not fit is skipped, never split
        chosen.extend(group)
    chosen_arr = np.array(sorted(chosen), dtype=np.int64)
    output = input_ids.copy()
    labels[chosen_arr] = input_ids[chosen_arr]
    draw = rng.random(len(chosen_arr))
    to_mask = chosen_arr[draw < 0.8]
    to_random = chosen_arr[(draw >= 0.8) & (draw < 0.9)]
    output[to_mask] = cfg.mask_token_id
    output[to_random] = rng.choice(cfg.replacement_ids, size=len(to_random))
    return output, labels
