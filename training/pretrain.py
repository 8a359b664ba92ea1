"""python -m training.pretrain: BERT pretraining (masked LM 15 % 80/10/10 + next-sentence prediction).

    python -m training.pretrain --corpus corpus.txt --vocab-size 16000 --preset mini \
        --output-dir runs/pretrain --max-steps 2000 --batch-size 64 --learning-rate 5e-4

The corpus (one sentence per line, blank line between documents) becomes NSP pairs in sharded numpy
files under <output-dir>/data (built once, reused when the settings match); masks are drawn anew
each time a batch is built. Writes best/ (by held-out MLM accuracy) and last/ (resumable) checkpoint
directories with the tokenizer, log.jsonl and metrics.json.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert.errors import one_line
from bert.options import option
from training.config import ConfigError, TrainConfig, is_model_spec, model_config, parse_config, run

VOCAB_MODELS = ("wordpiece", "unigram")


@dataclass
class PretrainConfig(TrainConfig):
    env_prefix = "BERTSERVE_PRETRAIN_"  # bert/options.py: an env var belongs to one command

    corpus: list[str] = option([], "corpus files: one sentence per line, blank line between documents")
    data_dir: str = option("", "where the instance shards go (default: <output-dir>/data); reused when settings match")
    tokenizer: str = option("", "an existing tokenizer directory (vocab.txt / tokenizer.json)")
    vocab_size: int = option(0, "instead of --tokenizer: train a vocabulary of this size on the corpus")
    vocab_model: str = option(
        "wordpiece", "what --vocab-size trains: wordpiece (BERT's) | unigram (SentencePiece-style, DeBERTa-v3's)"
    )
    do_lower_case: bool = option(True, "lower-case when training a new vocabulary")
    preset: str = option(
        "mini", "architecture, randomly initialised: tiny | mini | small | medium | base | large, or a config.json"
    )
    ckpt: str = option("", "instead of --preset: continue pretraining this checkpoint")
    max_seq_length: int = option(
        128,
        "tokens per instance, [CLS] A [SEP] B [SEP] included; at most the model's max_position_embeddings",
        minimum=8,
    )
    short_seq_prob: float = option(0.1, "probability of a shorter target length for an instance", minimum=0, maximum=1)
    masked_lm_prob: float = option(0.15, "fraction of tokens chosen for prediction")
    max_predictions_per_seq: int = option(20, "cap on predicted tokens per sequence", minimum=1)
    whole_word_mask: bool = option(False, "choose whole words (a word piece and its ## continuations)")
    dupe_factor: int = option(5, "copies of the corpus with different pairings and truncations", minimum=1)
    nsp: bool = option(True, "next-sentence prediction (off: MLM only, B is always the real continuation)")
    heldout_percent: float = option(5.0, "percent of documents (stable hash of the first line) held out for evaluation")
    data_seed: int = option(12345, "seed of instance creation and of the fixed evaluation masks")
    max_eval_instances: int = option(2000, "held-out instances scored per evaluation", minimum=0)
    eval_batch_size: int = option(64, "instances per evaluation batch", minimum=1)
    instances_per_shard: int = option(20000, "instances per shard file", minimum=1)
    documents_per_buffer: int = option(
        2000, "documents tokenized together (NotNext partners come from the same buffer)", minimum=1
    )
    stop_at_step: int = option(
        0, "stop as if interrupted after this step (schedule unchanged; then --resume)", minimum=0
    )

    def task_problems(self) -> list[str]:
        from bert.config import PRESETS, BertConfig

        problems = []
        has_data = bool(self.data_dir) and (Path(self.data_dir) / "index.json").is_file()
        if not self.corpus and not has_data:
            problems.append("--corpus is required (or --data-dir holding built shards)")
        for path in self.corpus:
            if not Path(path).is_file():
                problems.append(f"corpus file {path} does not exist")
        if self.corpus and all(Path(path).is_file() for path in self.corpus) and not has_data:
            problems += corpus_problems(self.corpus)
        if self.tokenizer and self.vocab_size:
            problems.append("--tokenizer and --vocab-size contradict each other (use a vocabulary, or train one)")
        if self.ckpt and self.vocab_size:
            problems.append("--ckpt brings its own vocabulary; --vocab-size would not match its embeddings")
        if not self.tokenizer and not self.vocab_size and not self.ckpt:
            problems.append("give --tokenizer DIR or --vocab-size N (or --ckpt)")
        if self.vocab_size and not 100 <= self.vocab_size <= 65535:
            problems.append(f"vocab_size must be in [100, 65535], got {self.vocab_size}")
        if self.vocab_model not in VOCAB_MODELS:
            problems.append(f"--vocab-model must be one of {', '.join(VOCAB_MODELS)}, got {self.vocab_model!r}")
        elif self.vocab_model == "unigram" and self.whole_word_mask:
            problems.append(
                "--whole-word-mask finds words by WordPiece's ## continuations: not with --vocab-model unigram"
            )
        if not self.ckpt and not is_model_spec(self.preset):
            problems.append(f"--preset must be one of {', '.join(PRESETS)} or a config.json, got {self.preset!r}")
        else:
            local = Path(self.ckpt) / "config.json"
            # a config.json that is not a BERT config: its one-line error, now
            config = (
                model_config(self.preset) if not self.ckpt else local.is_file() and BertConfig.from_json_file(local)
            )
            if config and self.max_seq_length > config.max_position_embeddings:
                problems.append(
                    f"--max-seq-length {self.max_seq_length} exceeds the model's max_position_embeddings "
                    f"{config.max_position_embeddings}"
                )
            if self.nsp and config and config.family.name != "bert":  # the one layout with a next-sentence head
                problems.append(f"{config.family.name} pretrains masked LM only (no next-sentence head): add --no-nsp")
        if not 0 < self.masked_lm_prob < 1:
            problems.append(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if 1 <= self.max_predictions_per_seq and self.max_predictions_per_seq > self.max_seq_length - 3:
            problems.append(
                f"max_predictions_per_seq ({self.max_predictions_per_seq}) cannot exceed the "
                f"maskable tokens of a sequence ({self.max_seq_length - 3})"
            )
        if not 0 < self.heldout_percent < 100:
            problems.append("heldout_percent must be in (0, 100): evaluation needs held-out documents")
        return problems


def corpus_problems(paths: list[str]) -> list[str]:
    """A corpus without one line of text (empty files, blank lines only) gives no instances to train or hold out,
    and bytes that are not UTF-8 anywhere in it would stop the run after its vocabulary or part of its shards were
    built: both refused before anything is written, the second naming the file and line. Every file is decoded in
    full here, a line at a time."""
    from bert.tasks.common import open_text
    from training.data_checks import undecodable_line

    has_text = False
    for path in paths:
        try:
            if problem := undecodable_line(path):
                return [f"corpus file {problem}"]
            if not has_text:
                with open_text(path) as f:
                    has_text = any(line.strip() for line in f)
        except (OSError, EOFError, ValueError) as e:  # a .gz that is not gzip (OSError) or is cut short (EOFError)
            return [f"corpus file {path} cannot be read: {one_line(e, 200)}"]
    if has_text:
        return []
    named = (
        paths[0]
        if len(paths) == 1
        else f"{len(paths)} files ({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''})"
    )
    return [f"--corpus {named}: no text in it (empty, or blank lines only); give one sentence per line"]


def train_unigram(files, *, vocab_size: int, model_max_length: int):
    """A Unigram vocabulary learnt on text files, in the pipeline transformers' DeBERTa-v2 tokenizer builds around
    one (whitespace runs folded, NFC, ▁ before every word, [CLS] A [SEP] B [SEP]), cased, so that its ids and
    offsets are the ones transformers gives for the saved tokenizer.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    from bert.tokenizer import CLS, SEP, SPECIAL_TOKENS, UNK, BertTokenizer

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(), normalizers.Strip(left=False)]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace("▁", prepend_scheme="always")])
    tokenizer.decoder = decoders.Metaspace("▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), unk_token=UNK, show_progress=False
    )
    tokenizer.train([str(f) for f in files], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, tokenizer.token_to_id(CLS)), (SEP, tokenizer.token_to_id(SEP))],
    )
    return BertTokenizer(tokenizer, do_lower_case=False, model_max_length=model_max_length)


class PretrainData:
    """training.loop.TrainData over memory-mapped instance shards, masked at batch time."""

    def __init__(
        self, shards, masking, batch_size: int, seed: int, pad_token_id: int, group_by_length: bool = True, nsp=True
    ):
        self.shards, self.masking = shards, masking
        self.nsp = nsp  # False: an MLM-only model, whose forward takes no nsp_labels
        self.batch_size, self.seed, self.pad_token_id = batch_size, seed, pad_token_id
        self.group_by_length = group_by_length
        self.lengths = np.concatenate([np.diff(p[1]) for p in shards.parts]) if shards.parts else np.zeros(0, int)

    def __len__(self) -> int:
        return len(self.shards)

    def batches(self, epoch: int) -> list[list[int]]:
        from training.task_data import length_grouped_batches

        rng = np.random.default_rng([self.seed, epoch, 2])
        return length_grouped_batches(self.lengths, self.batch_size, rng, group_by_length=self.group_by_length)

    def collate(self, indices, rng: np.random.Generator):
        batch = collate_instances(self.shards, indices, self.masking, rng, self.pad_token_id)
        if not self.nsp:
            batch.pop("nsp_labels")
        return batch


def collate_instances(shards, indices, masking, rng, pad_token_id: int):
    import torch

    from training.data.pretraining import mask_tokens

    rows = [shards[i] for i in indices]
    width = max(len(ids) for ids, _, _ in rows)
    input_ids = np.full((len(rows), width), pad_token_id, dtype=np.int64)
    token_type_ids = np.zeros_like(input_ids)
    attention_mask = np.zeros_like(input_ids)
    mlm_labels = np.full_like(input_ids, -100)
    nsp_labels = np.zeros(len(rows), dtype=np.int64)
    for r, (ids, a_length, nsp) in enumerate(rows):
        masked, labels = mask_tokens(ids, masking, rng)
        n = len(ids)
        input_ids[r, :n], mlm_labels[r, :n], attention_mask[r, :n] = masked, labels, 1
        token_type_ids[r, a_length:n] = 1
        nsp_labels[r] = nsp
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "mlm_labels": mlm_labels,
        "nsp_labels": nsp_labels,
    }
    return {k: torch.from_numpy(v) for k, v in batch.items()}


def evaluate_pretraining(
    model, shards, masking, *, seed: int, max_instances: int, batch_size: int, pad_token_id: int, nsp: bool
) -> dict:
    """Held-out MLM accuracy/loss and NSP accuracy with fixed masks (the same every evaluation)."""
    import torch

    device = next(model.parameters()).device
    n = min(len(shards), max_instances)
    correct = total = nsp_correct = 0
    loss_sum = 0.0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            indices = list(range(start, min(n, start + batch_size)))
            batch = collate_instances(shards, indices, masking, np.random.default_rng([seed, 7, start]), pad_token_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            nsp_labels = batch.pop("nsp_labels")
            out = model(**batch, **({"nsp_labels": nsp_labels} if nsp else {}))
            selected = batch["mlm_labels"][batch["mlm_labels"] != -100]
            correct += int((out.mlm_logits.argmax(-1) == selected).sum())
            total += int(selected.numel())
            loss_sum += float(out.mlm_loss) * int(selected.numel())
            if nsp:
                nsp_correct += int((out.nsp_logits.argmax(-1) == nsp_labels).sum())
    metrics = {
        "mlm_accuracy": correct / max(total, 1),
        "mlm_loss": loss_sum / max(total, 1),
        "masked_tokens": total,
        "instances": n,
    }
    if nsp:
        metrics["nsp_accuracy"] = nsp_correct / max(n, 1)
    return metrics


def _data_matches(index: dict, cfg: PretrainConfig, vocab_size: int) -> bool:
    from training.data.pretraining import corpus_files

    wanted = {
        "max_seq_length": cfg.max_seq_length,
        "short_seq_prob": cfg.short_seq_prob,
        "dupe_factor": cfg.dupe_factor,
        "nsp": cfg.nsp,
        "heldout_percent": cfg.heldout_percent,
        "seed": cfg.data_seed,
        "vocab_size": vocab_size,
        "corpus": [str(p) for p in cfg.corpus],
        "corpus_files": corpus_files(cfg.corpus),
    }
    return all(index.get(k) == v for k, v in wanted.items()) or not cfg.corpus


def main(argv=None) -> int:
    cfg = parse_config(PretrainConfig, argv, description=__doc__.split("\n")[0])
    import torch

    from bert.atomic import publish_dir
    from bert.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
    from bert.model import BertForMaskedLM, BertForPreTraining
    from bert.tokenizer import BertTokenizer
    from training.data.pretraining import MaskingConfig, PretrainingShards, continuation_flags, create_pretraining_data
    from training.loop import (
        _barrier,
        check_init_checkpoint,
        check_resume_plan,
        finish_run,
        setup_distributed,
        train,
    )

    check_init_checkpoint(cfg.ckpt)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    dist, device = setup_distributed(cfg.device)
    out = Path(cfg.output_dir)
    tokenizer_dir = out / "tokenizer"
    if dist.main:
        out.mkdir(parents=True, exist_ok=True)
        if cfg.vocab_size and not (tokenizer_dir / "tokenizer.json").is_file():
            print(f"training a {cfg.vocab_size}-piece {cfg.vocab_model} vocabulary on {cfg.corpus}", file=sys.stderr)
            if cfg.vocab_model == "unigram":
                trained = train_unigram(cfg.corpus, vocab_size=cfg.vocab_size, model_max_length=cfg.max_seq_length)
            else:
                trained = BertTokenizer.train(
                    cfg.corpus,
                    vocab_size=cfg.vocab_size,
                    do_lower_case=cfg.do_lower_case,
                    show_progress=False,
                    model_max_length=cfg.max_seq_length,
                )
            with publish_dir(tokenizer_dir) as directory:  # a killed run never leaves half a vocabulary
                trained.save(directory)
    _barrier(dist)
    source = tokenizer_dir if cfg.vocab_size else Path(cfg.tokenizer or resolve_checkpoint(cfg.ckpt))
    if dist.main and not cfg.vocab_size:
        with publish_dir(tokenizer_dir) as directory:  # the run keeps the vocabulary it was trained with
            BertTokenizer.from_dir(source).save(directory)
    tokenizer = BertTokenizer.from_dir(source)

    data_dir = Path(cfg.data_dir or out / "data")
    if dist.main:
        index_path = data_dir / "index.json"
        if not (index_path.is_file() and _data_matches(json.loads(index_path.read_text()), cfg, tokenizer.vocab_size)):
            print(f"building pretraining instances in {data_dir}", file=sys.stderr)
            index = create_pretraining_data(
                cfg.corpus,
                tokenizer,
                data_dir,
                max_seq_length=cfg.max_seq_length,
                short_seq_prob=cfg.short_seq_prob,
                dupe_factor=cfg.dupe_factor,
                nsp=cfg.nsp,
                heldout_percent=cfg.heldout_percent,
                seed=cfg.data_seed,
                documents_per_buffer=cfg.documents_per_buffer,
                instances_per_shard=cfg.instances_per_shard,
            )
            print(f"instances: {json.dumps(index['counts'])}", file=sys.stderr)
    _barrier(dist)
    train_shards, heldout_shards = PretrainingShards(data_dir, "train"), PretrainingShards(data_dir, "heldout")
    if len(heldout_shards) == 0:
        raise ConfigError(f"no held-out instances: raise --heldout-percent (now {cfg.heldout_percent})")

    masking = MaskingConfig(
        mask_token_id=tokenizer.mask_token_id,
        vocab_size=tokenizer.vocab_size,
        special_ids=tuple(tokenizer.all_special_ids),
        masked_lm_prob=cfg.masked_lm_prob,
        max_predictions_per_seq=cfg.max_predictions_per_seq,
        whole_word_mask=cfg.whole_word_mask,
        continuation=continuation_flags(tokenizer) if cfg.whole_word_mask else None,
    )
    data = PretrainData(
        train_shards, masking, cfg.batch_size, cfg.seed, tokenizer.pad_token_id, cfg.group_by_length, cfg.nsp
    )
    check_resume_plan(cfg, len(data.batches(0)))  # a --resume that plans other steps: one line, no model built
    model_cls = BertForPreTraining if cfg.nsp else BertForMaskedLM
    torch.manual_seed(cfg.seed)
    if cfg.ckpt:
        model, _ = load_checkpoint(cfg.ckpt, model_cls, from_backbone=True)
    else:
        config = model_config(cfg.preset, vocab_size=tokenizer.vocab_size)
        model = model_cls(config)
    model.train()
    if dist.main:
        n_params = sum(p.numel() for p in model.parameters())
        print(
            f"pretrain: {len(train_shards)} train / {len(heldout_shards)} held-out instances, "
            f"{len(data.batches(0))} steps/epoch, {n_params / 1e6:.1f}M parameters, device {device}",
            file=sys.stderr,
        )

    def evaluate(m):
        return evaluate_pretraining(
            m,
            heldout_shards,
            masking,
            seed=cfg.data_seed,
            max_instances=cfg.max_eval_instances,
            batch_size=cfg.eval_batch_size,
            pad_token_id=tokenizer.pad_token_id,
            nsp=cfg.nsp,
        )

    def save_model(m, directory: Path) -> None:
        save_checkpoint(
            m,
            directory,
            tokenizer=tokenizer,
            extra_files={"pretrain_config.json": json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"},
        )

    result = train(
        cfg,
        model,
        data,
        save_model=save_model,
        evaluate=evaluate,
        best_metric="mlm_accuracy",
        dist=dist,
        device=device,
        stop_at_step=cfg.stop_at_step,
    )
    summary = {
        "steps": result["step"],
        "total_steps": result["total_steps"],
        "best": result["best"],
        "last_eval": result["last_eval"],
    }
    return finish_run(dist, out, summary, interrupted=result["interrupted"])


if __name__ == "__main__":
    sys.exit(run(main))
