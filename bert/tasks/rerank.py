"""Rerank: a cross-encoder scores how well each text answers a query; the texts come back best first.

A cross-encoder is a sequence-pair classifier with one output (sentence-transformers' `CrossEncoder`): each
(query, text) pair is one model input, `[CLS] query [SEP] text [SEP]`, and one item of the server's shared
token-budget batch. Scores are the logit through a sigmoid (CrossEncoder.predict's default for one output), or
the raw logit with `raw_scores`. Two HTTP shapes: text-embeddings-inference's `/rerank` and the `/v1/rerank`
that infinity, Cohere and Jina use.

Trainable (python -m training.finetune --task rerank): a TSV of (query, text, label) rows with 0/1 or graded
labels, or `squad:PATH[,PATH...]`, which makes each SQuAD question a query against the sentences of its paragraph
(the one holding the answer is relevant) and the few sentences of its article's other paragraphs that share most
words with it (--heldout-articles N keeps the last N articles for evaluation). With --rerank-mined FILE (written
by python -m training.mine_rerank) the training queries are instead each question against its answer's sentence
and the --rerank-negatives sentences of its article a bi-encoder ranks highest (hard negatives: the distractors
the reranker meets behind that bi-encoder); the held-out evaluation is unchanged. Loss (--rerank-loss): pointwise,
BCE with logits on the one output per pair; or listwise, softmax cross-entropy over each query's candidates
(batches then hold whole queries). Metrics: MRR (the main one) and recall@1 over each query's candidates.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

from bert.config import ConfigError
from bert.errors import json_fields, json_type, one_line
from bert.tasks import classify
from bert.tasks.base import (
    MODEL,
    EmptyInput,
    Head,
    JobColumns,
    Labels,
    Param,
    Route,
    Task,
    TaskOption,
    check_texts,
    described,
)
from bert.tasks.common import Features, Limits, ModelFacts, OpenAIUsage, bounded_text, open_text, sigmoid
from bert.tasks.qa import HELDOUT_ARTICLES, read_squad_articles, split_heldout
from bert.tasks.windows import LongInputs, TooManyWindows, cut_texts, pair_template, too_much_work
from bert.tokenizer import InputTooLong


def encode(tokenizer, pairs: list, *, max_length: int = 512, truncate: bool = False):
    """(query, text) pairs -> Features; too long: InputTooLong, or with `truncate` cut longest-first."""
    return classify.encode(tokenizer, [tuple(p) for p in pairs], max_length=max_length, truncate=truncate)


def scores(logits, *, raw: bool = False) -> list[float]:
    """(N, 1) logits -> one score per pair: sigmoid(logit), or the logit itself."""
    logits = np.asarray(logits, dtype=np.float32).reshape(len(logits), -1)[:, 0]
    return [float(s) for s in (logits if raw else sigmoid(logits))]


def ranked(values: list[float]) -> list[int]:
    """Indices by descending score; ties keep the texts' order."""
    return sorted(range(len(values)), key=lambda i: -values[i])


def best_logits(outputs: list) -> list[float]:
    """Per (query, text) pair, its logit: MaxP, a long text is as relevant as its best window (the sigmoid keeps
    the logits' order)."""
    return [float(max(np.asarray(s["rerank"], dtype=np.float32).reshape(-1)[0] for s in o)) for o in outputs]


def margins(pairs: list, outputs: list) -> list[float]:
    """Per (query, text) pair, how sure its query's top text is of this pair: for the query's best text, its lead
    over the second best; for any other, how far it trails the best (logits; inf for a query's only text). Every
    text closer to its query's best than the verify margin is then scored again, the best with them, so the
    exact model decides among all texts the fast one could have put in the wrong order at the top: a fast model
    whose logits are within half the margin of the exact one's puts the exact one's best text first."""
    logits = best_logits(outputs)
    by_query: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        by_query.setdefault(pair[0], []).append(i)
    found = [math.inf] * len(pairs)
    for indices in by_query.values():
        if len(indices) < 2:
            continue
        ordered = [indices[k] for k in ranked([logits[i] for i in indices])]
        top = logits[ordered[0]]
        found[ordered[0]] = top - logits[ordered[1]]
        for i in ordered[1:]:
            found[i] = top - logits[i]
    return found


# ---- long documents: scored by their best window (MaxP) ------------------------------------------------
LONG_INPUTS = LongInputs(
    merge="the document's score is its best window's (MaxP)",
    whole_words=True,
)


def encode_windows(tokenizer, pairs: list, limits: Limits) -> list[list[Features]]:
    """(query, document) pairs -> per pair its windows [CLS] query [SEP] piece [SEP]: one for a document that fits
    beside its query, else whole-word pieces sharing LONG_INPUTS' stride, at most limits.max_sequences in all
    (TooMuchWork beyond, before any is built). A query that leaves no room for a document: InputTooLong."""
    before, between, after, document_type = pair_template(tokenizer)
    queries: dict[str, list[int]] = {}
    for index, (query, _) in enumerate(pairs):
        if query not in queries:
            room = limits.max_length - len(before) - len(between) - len(after)
            cut, was_cut = bounded_text(tokenizer, query, room)
            ids = [] if was_cut else list(tokenizer.encode_batch([cut], add_special_tokens=False)[0].ids)
            if was_cut or len(ids) >= room:
                raise InputTooLong(
                    index, None if was_cut else len(ids) + limits.max_length - room, limits.max_length, "the query"
                )
            queries[query] = ids
    capacities = {
        q: limits.max_length - len(before) - len(ids) - len(between) - len(after) for q, ids in queries.items()
    }
    # One query per request in both HTTP shapes; windows are cut for the narrowest room a query leaves.
    capacity = min(capacities.values())
    stride = LONG_INPUTS.stride(None, capacity, limits.max_length)
    try:
        pieces = cut_texts(
            tokenizer,
            [document for _, document in pairs],
            capacity=capacity,
            stride=stride,
            max_windows=limits.max_sequences,
            whole_words=True,
        )
    except TooManyWindows as e:
        raise too_much_work(e.needed, 0, limits.max_sequences, limits.max_length, "documents") from None
    windows = []
    for (query, _), document in zip(pairs, pieces):
        head = [*before, *queries[query], *between]
        windows.append(
            [
                Features(
                    input_ids=[*head, *document.ids[start:stop], *after],
                    token_type_ids=[0] * len(head) + [document_type] * (stop - start + len(after)),
                )
                for start, stop in document.ranges
            ]
        )
    return windows


# ---- training data: TSV rows or SQuAD questions against their paragraph's sentences -------------------
SQUAD_PREFIX = "squad:"


# ---------------------------------------------------------------------- module level (above the Task class)


@dataclass
class RerankQuery:
    """One query with its candidate texts and their labels (0/1 or graded, as read)."""

    query: str
    texts: list[str]
    labels: list[float]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of a paragraph: cut after . ! or ? followed by white space;
    blank pieces dropped. Simple on purpose: SQuAD paragraphs are edited prose."""
    spans, start = [], 0
    for cut in re.finditer(r"(?<=[.!?])\s+", text):
        spans.append((start, cut.start()))
        start = cut.end()
    spans.append((start, len(text)))
    return [(a, b) for a, b in spans if text[a:b].strip()]


WORD = re.compile(r"\w+")
# Per SQuAD question, this many sentences from the other paragraphs of its article join the candidates: the ones
# sharing the most (IDF-weighted) words with the question. Search ranks a question against its whole article, so
# a reranker must also learn to turn down on-topic sentences of other paragraphs, not only its own neighbours.
ARTICLE_NEGATIVES = 4


def _words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def article_requests(article: dict, texts: int):
    """(question, `texts` sentences of its article: its paragraph's first, then the other paragraphs' in order) for
    each SQuAD question of `article` whose article has that many: a /rerank request with candidates close to one
    another (bench.server_bench's load, evals.int8_agreement's held-out set)."""
    paragraphs = [[p["context"][a:b] for a, b in sentence_spans(p["context"])] for p in article["paragraphs"]]
    for i, paragraph in enumerate(article["paragraphs"]):
        candidates = (paragraphs[i] + [s for j, ss in enumerate(paragraphs) if j != i for s in ss])[:texts]
        if len(candidates) == texts:
            yield from ((qa["question"], candidates) for qa in paragraph["qas"])


def squad_queries(
    articles: list[dict], *, article_negatives: int = ARTICLE_NEGATIVES, role: str = ""
) -> list[RerankQuery]:
    """Per answerable SQuAD question: its paragraph's sentences (1 for the one holding the first answer's start)
    and `article_negatives` word-overlap-nearest sentences of its article's other paragraphs (0). Questions come
    interleaved across articles (each article's first, then each one's second, ...), so the first N span them all.
    A question that cannot be a query (no answer, an answer starting in no sentence, a single candidate) is left
    out, and how many were and why is one line on stderr (`role`, e.g. training, says which questions they were),
    as qa's skipped answers are."""
    per_article = []
    left_out: Counter = Counter()
    total = 0
    for article in articles:
        paragraphs = [(p["context"], sentence_spans(p["context"]), p["qas"]) for p in article["paragraphs"]]
        sentences = [(at, context[a:b]) for at, (context, spans, _) in enumerate(paragraphs) for a, b in spans]
        words = [_words(text) for _, text in sentences]
        df = Counter(w for ws in words for w in ws)
        idf = {w: math.log((len(sentences) + 1) / (c + 0.5)) for w, c in df.items()}
        # Per word, the article's sentences holding it: a question's overlap with every sentence is then a sum over
        # its own words' sentences (memory as the article's words, time as their postings), not a set intersection
        # per sentence. The IDFs are added in ascending order, so that overlaps of equal worth (words of equal
        # document frequency) score exactly equal and the earlier sentence comes first, whatever the words.
        postings: dict[str, list[int]] = {}
        for j, ws in enumerate(words):
            for w in ws:
                postings.setdefault(w, []).append(j)
        holding = {w: np.array(js) for w, js in postings.items()}
        paragraph_of = np.array([p for p, _ in sentences])
        queries = []
        for at, (context, spans, qas) in enumerate(paragraphs):
            for qa in qas:
                total += 1
                answers = qa.get("answers") or []
                if qa.get("is_impossible") or not answers:
                    left_out["with no answer"] += 1  # nothing to rank
                    continue
                start = int(answers[0]["answer_start"])
                labels = [1.0 if a <= start < b else 0.0 for a, b in spans]
                if sum(labels) != 1.0:
                    left_out["whose answer starts in no sentence (between two, or outside the context)"] += 1
                    continue
                texts = [context[a:b] for a, b in spans]
                if article_negatives > 0:
                    scores = np.zeros(len(sentences))
                    for weight, w in sorted((idf[w], w) for w in _words(qa["question"]) if w in idf):
                        scores[holding[w]] += weight
                    others = np.flatnonzero(paragraph_of != at)
                    # The highest overlap first, the earlier sentence first among equals.
                    picked = others[np.argsort(-scores[others], kind="stable")[:article_negatives]].tolist()
                    texts += [sentences[j][1] for j in picked]
                    labels += [0.0] * len(picked)
                if len(texts) < 2:  # a one-sentence paragraph alone has nothing to rank
                    left_out["with one candidate sentence only (nothing to rank it against)"] += 1
                    continue
                queries.append(RerankQuery(qa["question"], texts, labels))
        per_article.append(queries)
    if left_out:
        which = f"{role} SQuAD questions" if role else "SQuAD questions"
        reasons = ", ".join(f"{n} {why}" for why, n in left_out.items())
        print(f"rerank: left out {left_out.total()} of {total} {which}: {reasons}", file=sys.stderr)
    interleaved = []
    for i in range(max(map(len, per_article), default=0)):
        interleaved += [qs[i] for qs in per_article if i < len(qs)]
    return interleaved


def mined_queries(mined: dict, negatives: int) -> list[RerankQuery]:
    """Per mined question (training.mine_rerank's file): its answer's sentence (1) first, then its `negatives`
    best-scored other sentences (0); a question with fewer mined is left out, so every query has 1 + negatives
    candidates, and how many were is one line on stderr. Interleaved across articles as squad_queries, so the
    first N span them all."""
    per_article: list[list[RerankQuery]] = [[] for _ in mined["articles"]]
    short = 0
    for q in mined["questions"]:
        sentences = mined["articles"][q["article"]]["sentences"]
        if len(q["negatives"]) < negatives:
            short += 1
            continue
        texts = [sentences[q["gold"]]] + [sentences[i] for i in q["negatives"][:negatives]]
        per_article[q["article"]].append(RerankQuery(q["question"], texts, [1.0] + [0.0] * negatives))
    if short:
        print(
            f"rerank: left out {short} of {len(mined['questions'])} mined questions with fewer than {negatives} "
            "negatives mined (--rerank-negatives)",
            file=sys.stderr,
        )
    interleaved = []
    for i in range(max(map(len, per_article), default=0)):
        interleaved += [qs[i] for qs in per_article if i < len(qs)]
    return interleaved


def read_mined(path: str, heldout_articles: int, heldout_titles: set[str]) -> dict:
    """training.mine_rerank's file, checked to be one (its structure, every index in range) and to hold none of
    the held-out articles. What is wrong is one ConfigError line naming this file and the place in it (the
    `questions[k]` entry): the data checks name the --train-data file for a DataError or a KeyError, and this is
    another file."""
    try:
        with open_text(path) as f:
            mined = json.load(f)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({one_line(e, 200)})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e}); give the file python -m training.mine_rerank wrote") from None
    if problem := mined_problem(mined):
        raise ConfigError(f"{path}: {problem}")
    settings = mined.get("settings") or {}
    if settings.get("heldout_articles") != heldout_articles:
        raise ConfigError(
            f"{path} was mined holding out {settings.get('heldout_articles')} articles, not --heldout-articles "
            f"{heldout_articles}: mine again with the same number"
        )
    overlap = sorted({a["title"] for a in mined["articles"]} & heldout_titles)
    if overlap:
        raise ConfigError(f"{path} holds held-out articles ({', '.join(overlap[:3])}): mine again")
    return mined


def mined_problem(mined) -> str | None:
    """Where a parsed mined file is not training.mine_rerank's structure (`articles[i]` of a title and sentences,
    `questions[k]` of a question, its article's index, its gold sentence's and its negatives' indices in that
    article), and what is wrong there; None when it is."""
    if not isinstance(mined, dict):
        return (
            f"a JSON {json_type(mined)}, not the object of settings, articles and questions that "
            "python -m training.mine_rerank writes"
        )
    if not isinstance(mined.get("settings", {}), dict):
        return f"'settings' is a JSON {json_type(mined['settings'])}, not an object"
    for name in ("articles", "questions"):
        if name not in mined:
            return f"no {name!r} array (not training.mine_rerank's file)"
        if not isinstance(mined[name], list):
            return f"{name!r} is a JSON {json_type(mined[name])}, not an array"
    articles = mined["articles"]
    for i, article in enumerate(articles):
        at = f"articles[{i}]"
        if problem := json_fields(article, at, {"title": str, "sentences": list}):
            return problem
        for j, sentence in enumerate(article["sentences"]):
            if not isinstance(sentence, str):
                return f"{at}.sentences[{j}] is a JSON {json_type(sentence)}, not a string"
    for k, question in enumerate(mined["questions"]):
        at = f"questions[{k}]"
        if problem := json_fields(question, at, {"question": str, "article": int, "gold": int, "negatives": list}):
            return problem
        if not 0 <= question["article"] < len(articles):
            return f"{at}.article is {question['article']}, not an index of the file's {len(articles)} articles"
        sentences = len(articles[question["article"]]["sentences"])
        where = f"a sentence index of articles[{question['article']}] (0 to {sentences - 1})"
        if not 0 <= question["gold"] < sentences:
            return f"{at}.gold is {question['gold']}, not {where}"
        for m, index in enumerate(question["negatives"]):
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < sentences:
                return f"{at}.negatives[{m}] is {json.dumps(index)}, not {where}"
    return None


def listwise_loss(logits, labels, query_ids):
    """Softmax cross-entropy over each query's candidates, averaged over queries: -sum_i p_i log softmax(s)_i,
    p the query's labels normalised to sum 1 (one relevant candidate: InfoNCE over its negatives). Candidates of
    a query are consecutive (query_ids runs); a query with no relevant candidate adds nothing."""
    import torch

    _, counts = torch.unique_consecutive(query_ids, return_counts=True)
    losses = []
    for s, y in zip(torch.split(logits.view(-1), counts.tolist()), torch.split(labels.view(-1), counts.tolist())):
        total = y.sum()
        if total > 0:
            losses.append(-(y / total * torch.log_softmax(s, dim=0)).sum())
    return torch.stack(losses).mean() if losses else logits.sum() * 0.0


def read_rerank_tsv(path: str, cfg) -> list[RerankQuery]:
    """(query, text, label) rows; rows sharing a query text are one query's candidates, in first-seen order. A
    label that is not a number, or is negative, is one ConfigError line naming the file and its line."""
    rows = classify.read_tsv(
        path,
        text_column=cfg.text_column,
        pair_column=cfg.pair_column or 1,
        label_column=cfg.label_column,
        header={"auto": None, "yes": True, "no": False}[cfg.header],
    )
    queries: dict[str, RerankQuery] = {}
    for index, row in enumerate(rows):
        try:
            label = float(row.label)
        except (TypeError, ValueError):
            where = classify.tsv_line(path, len(rows), index)
            raise ConfigError(f"{where}: rerank label {row.label!r} is not a number (0/1 or a grade)") from None
        if label < 0:
            raise ConfigError(f"{classify.tsv_line(path, len(rows), index)}: rerank label {row.label!r} is negative")
        group = queries.setdefault(row.text, RerankQuery(row.text, [], []))
        group.texts.append(row.pair)
        group.labels.append(label)
    return list(queries.values())


def ranking_metrics(groups: list[tuple[list[float], list[float]]]) -> dict:
    """recall@1 and MRR over queries, each given as (scores, labels) of its candidates. Relevant: a candidate with
    the query's highest label, when that is above 0; ties in score rank the lower index first (stable)."""
    reciprocal, top1, counted = 0.0, 0, 0
    for scores, labels in groups:
        best = max(labels) if labels else 0.0
        if best <= 0:
            continue
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        rank = next(r for r, i in enumerate(order, 1) if labels[i] == best)
        reciprocal += 1.0 / rank
        top1 += rank == 1
        counted += 1
    return {
        "mrr": reciprocal / counted if counted else 0.0,
        "recall_at_1": top1 / counted if counted else 0.0,
        "queries": counted,
        "candidates": sum(len(s) for s, _ in groups),
    }


# ---- the two HTTP shapes ------------------------------------------------------------------------------
def _tei_items(body) -> tuple[list, dict]:
    return [[body.query, text] for text in body.texts], {"raw_scores": body.raw_scores, "truncate": body.truncate}


def _check_tei(body, info=None) -> None:
    check_texts([body.query], "query")
    if not body.texts:
        raise EmptyInput("texts is empty")
    check_texts(body.texts, "texts[{}]")


def _tei_shape(values: list[float], body, info=None) -> list[dict]:
    return [
        {"index": i, "score": values[i], **({"text": body.texts[i]} if body.return_text else {})}
        for i in ranked(values)
    ]


def _v1_items(body) -> tuple[list, dict]:
    return [[body.query, doc] for doc in body.documents], {"raw_scores": False, "truncate": body.truncate}


def _check_v1(body, info=None) -> None:
    check_texts([body.query], "query")
    if not body.documents:
        raise EmptyInput("documents is empty")
    check_texts(body.documents, "documents[{}]")


@dataclass
class Ranked:
    """A text's place in /rerank's answer (text-embeddings-inference's shape)."""

    index: int = described("the text's position in the request")
    score: float
    text: Optional[str] = None


@dataclass
class V1Document:
    """A document as the request sent it (with `return_documents`)."""

    text: str


@dataclass
class V1Ranked:
    """A document's place in /v1/rerank's answer."""

    index: int
    relevance_score: float
    document: Optional[V1Document] = None  # Cohere's and Jina's shape: their clients read document.text


@dataclass(kw_only=True)
class V1RerankResponse:
    """/v1/rerank's answer: the shape of infinity, Cohere and Jina."""

    object: Literal["rerank"] = "rerank"
    model: str
    results: list[V1Ranked]
    usage: OpenAIUsage


def _v1_shape(values: list[float], body, info) -> dict:
    order = ranked(values)[: body.top_n] if body.top_n is not None else ranked(values)
    tokens = info.tokens
    return {
        "object": "rerank",
        "model": body.model or info.model_name,
        "results": [
            {
                "index": i,
                "relevance_score": values[i],
                **({"document": {"text": body.documents[i]}} if body.return_documents else {}),
            }
            for i in order
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


RERANK_MINED = TaskOption(
    "rerank_mined",
    "",
    "rerank: train on this file of bi-encoder-mined negatives (python -m training.mine_rerank) instead of the "
    "squad: candidates; needs --train-data squad:PATH with the --heldout-articles it was mined with",
    multitask=False,
    evaluate=False,
)
RERANK_NEGATIVES = TaskOption(
    "rerank_negatives",
    7,
    "rerank with --rerank-mined: the k hardest mined negatives per question (1 + k candidates each)",
    minimum=1,
    multitask=False,
    evaluate=False,
)
RERANK_LOSS = TaskOption(
    "rerank_loss",
    "pointwise",
    "rerank: pointwise (BCE per pair) | listwise (softmax cross-entropy over each question's candidates; "
    "needs --rerank-mined, --batch-size a multiple of 1 + --rerank-negatives)",
    multitask=False,
    evaluate=False,
)
LOSSES = ("pointwise", "listwise")


class RerankTask(Task):
    """A cross-encoder: a one-output sequence-pair classifier; any such checkpoint serves it."""

    name = "rerank"
    many_inputs_per_item = True  # a query against each of its texts: a request of 20 texts is 20 model inputs
    order = 50
    head = Head("sequence", attribute="rerank_classifier", single_attribute="classifier", width=1)
    architectures = ("BertForSequenceClassification",)
    graph_outputs = {"rerank_logits": "rerank"}
    single_graph_outputs = {"logits": "rerank"}
    routes = (
        Route(
            "/rerank",
            "RerankRequest",
            list[Ranked],
            "Rerank texts by relevance to a query (text-embeddings-inference's shape)",
            to_items=_tei_items,
            shape=_tei_shape,
            check=_check_tei,
            batch_field="texts",
            fields=(
                MODEL,
                Param("query", str, help="what the texts are ranked for", examples=("What is the capital of France?",)),
                Param(
                    "texts",
                    list[str],
                    help="the texts to rank; each (query, text) pair is one model input",
                    examples=(["Paris is the capital of France.", "Berlin is in Germany."],),
                ),
                Param("raw_scores", bool, False, "the model's logit instead of its sigmoid", job=True),
                Param("return_text", bool, False, "echo each text beside its score"),
                Param(
                    "truncate",
                    bool,
                    False,
                    "cut pairs longer than the model's limit instead of scoring a long text by its best window (MaxP)",
                ),
            ),
            doc="Each (query, text) pair is scored by the cross-encoder (one model input each, batched with all other "
            "requests); the texts come back best first as {index, score, text?}. Scores are the logit's sigmoid, or "
            "the logit itself with `raw_scores`.",
        ),
        Route(
            "/v1/rerank",
            "V1RerankRequest",
            V1RerankResponse,
            "Rerank documents by relevance to a query (the shape of infinity, Cohere and Jina)",
            to_items=_v1_items,
            shape=_v1_shape,
            check=_check_v1,
            batch_field="documents",
            fields=(
                MODEL,
                Param("query", str, examples=("What is the capital of France?",)),
                Param("documents", list[str], examples=(["Paris is the capital of France.", "Berlin is in Germany."],)),
                Param("top_n", Optional[int], None, "return only the best N (default: all)", minimum=1),
                Param("return_documents", bool, False, "echo each document beside its score"),
                Param(
                    "truncate",
                    bool,
                    False,
                    "cut pairs longer than the model's limit instead of scoring a long document by its best window "
                    "(MaxP)",
                ),
            ),
            doc="The rerank API of infinity, Cohere and Jina: the documents by relevance to the query, best first, "
            "the best `top_n` of them; `relevance_score` is the cross-encoder's sigmoid; `usage` counts the input "
            "tokens.",
        ),
    )
    job = JobColumns(
        inputs=("query", "document"),
        arity=(2,),
        results=(("score", "float32"),),
        values=lambda answers: {"score": answers},
        to_item=lambda texts, options: list(texts),
    )
    calibration = "ranked_groups"
    agreement = "ranked"  # what a user of a reranker sees: the text it puts first

    def serves(self, config: dict) -> bool:
        labels = config.get("id2label") or {}
        return len(labels) == 1 or config.get("num_labels") == 1

    long_inputs = LONG_INPUTS

    def encode_request(self, tokenizer, items: list, limits: Limits, *, truncate: bool = False, **_):
        if truncate:
            return [[f] for f in encode(tokenizer, items, max_length=limits.max_length, truncate=True)]
        return encode_windows(tokenizer, items, limits)

    def decode_request(self, items, features, outputs, facts: ModelFacts, *, raw_scores: bool = False, **_):
        return scores(np.asarray(best_logits(outputs))[:, None], raw=raw_scores)

    def margins(self, items, features, outputs, facts, **_):
        return margins(items, outputs)

    def decisions(self, items, answers):
        """Per query (the items' first text), the text it puts first."""
        by_query: dict[str, list[int]] = {}
        for i, pair in enumerate(items):
            by_query.setdefault(pair[0], []).append(i)
        return [items[max(indices, key=lambda i: answers[i])][1] for indices in by_query.values()]

    verify_margin = TaskOption(
        "verify_margin",
        0.3,
        "recompute the best text of a query and every text whose logit is within this of it, where two or more "
        "are (logits, the model's raw scores)",
        minimum=0,
    )

    # ---- training hooks: queries with candidate texts (RerankQuery) --------------------------------------
    trainable = True
    main_metric = "mrr"
    train_options = (*classify.TSV_OPTIONS, HELDOUT_ARTICLES, RERANK_MINED, RERANK_NEGATIVES, RERANK_LOSS)
    train_data_help = "TSV (query, text, label) or squad:PATH[,PATH...]"

    def train_problems(self, cfg) -> list[str]:
        problems = []
        squad = cfg.train_data.startswith(SQUAD_PREFIX)
        if not cfg.eval_data and not (squad and cfg.heldout_articles > 0):
            # (--heldout-articles with a TSV and --eval-data is ignored: multitask shares the flag with qa)
            problems.append("--eval-data is required (or --train-data squad:PATH with --heldout-articles N)")
        if cfg.header not in ("auto", "yes", "no"):
            problems.append(f"--header must be auto, yes or no, got {cfg.header!r}")
        loss, negatives = getattr(cfg, "rerank_loss", "pointwise"), getattr(cfg, "rerank_negatives", 1)
        mined = getattr(cfg, "rerank_mined", "")
        if loss not in LOSSES:
            problems.append(f"--rerank-loss must be {' or '.join(LOSSES)}, got {loss!r}")
        if negatives < 1:
            problems.append(f"--rerank-negatives must be >= 1, got {negatives}")
        if mined and not (squad and cfg.heldout_articles > 0):
            problems.append("--rerank-mined needs --train-data squad:PATH and --heldout-articles N (as mined)")
        if loss == "listwise":
            group = 1 + negatives
            if not mined:
                problems.append("--rerank-loss listwise needs --rerank-mined (queries of 1 + k candidates)")
            if cfg.batch_size % group:
                problems.append(f"--rerank-loss listwise: --batch-size must be a multiple of {group} (1 + k)")
            if cfg.grad_accum_steps != 1:
                problems.append("--rerank-loss listwise: --grad-accum-steps must be 1 (a query's candidates together)")
        return problems

    def read_examples(self, cfg, *, train: bool = True) -> tuple[list, list]:
        def read(path: str, role: str) -> list[RerankQuery]:
            if path.startswith(SQUAD_PREFIX):
                return squad_queries(read_squad_articles(path[len(SQUAD_PREFIX) :]), role=role)
            return read_rerank_tsv(path, cfg)

        training, heldout = [], []
        if cfg.train_data.startswith(SQUAD_PREFIX) and (train or not cfg.eval_data):
            articles = read_squad_articles(cfg.train_data[len(SQUAD_PREFIX) :])
            kept, held = split_heldout(articles, cfg.heldout_articles)
            heldout = squad_queries(held, role="held-out")
            if getattr(cfg, "rerank_mined", "") and train:
                titles = {a.get("title", "") for a in held}
                training = mined_queries(
                    read_mined(cfg.rerank_mined, cfg.heldout_articles, titles), cfg.rerank_negatives
                )
            elif train:
                training = squad_queries(kept, role="training")
        elif train:
            training = read(cfg.train_data, "training")
        evaluation = read(cfg.eval_data, "evaluation") if cfg.eval_data else heldout
        return (training if train else []), evaluation

    def train_labels(self, cfg, train: list, evaluation: list) -> Labels:
        # One output; BCE with logits (transformers' multi-label rule), so the single-task model's own loss is ours.
        return Labels(None, ["relevance"], "multi_label_classification")

    def saved_labels(self, cfg, model_config, saved: dict) -> Labels:
        return Labels(None, ["relevance"], "multi_label_classification")

    def encode_train(self, tokenizer, examples: list, labels: Labels, cfg) -> tuple[list, list]:
        top = max((label for q in examples for label in q.labels), default=1.0)
        scale = top if top > 1.0 else 1.0  # graded 0..G -> [0, 1]; 0/1 labels unchanged
        pairs = [(q.query, text) for q in examples for text in q.texts]
        targets = [label / scale for q in examples for label in q.labels]
        if getattr(cfg, "rerank_loss", "pointwise") == "listwise":
            # (label, query number): the loss groups a batch's pairs by query
            targets = [(t, n) for t, n in zip(targets, (n for n, q in enumerate(examples) for _ in q.texts))]
        return classify.encode(tokenizer, pairs, max_length=cfg.max_seq_length, truncate=True), targets

    def train_group_size(self, cfg) -> int:
        return 1 + cfg.rerank_negatives if getattr(cfg, "rerank_loss", "pointwise") == "listwise" else 1

    def collate_targets(self, targets: list, width: int) -> dict:
        import torch

        if targets and isinstance(targets[0], tuple):
            labels, queries = zip(*targets)
            return {
                "labels": torch.tensor(labels, dtype=torch.float32).view(-1, 1),
                "query_ids": torch.tensor(queries, dtype=torch.long),
            }
        return {"labels": torch.tensor(targets, dtype=torch.float32).view(-1, 1)}  # (B, 1), as the logits

    def loss(self, outputs: dict, batch: dict):
        import torch.nn.functional as F

        logits = outputs[self.output_name("rerank")].float()
        if "query_ids" in batch:
            return listwise_loss(logits, batch["labels"], batch["query_ids"])
        return F.binary_cross_entropy_with_logits(logits.view(-1), batch["labels"].view(-1))

    def evaluate(self, model, tokenizer, examples: list, labels: Labels, cfg) -> dict:
        from bert.running import run_model

        pairs = [(q.query, text) for q in examples for text in q.texts]
        features = classify.encode(tokenizer, pairs, max_length=cfg.max_seq_length, truncate=True)
        scores = [
            float(r[0][0])
            for r in run_model(model, features, batch_size=cfg.eval_batch_size, pad_token_id=tokenizer.pad_token_id)
        ]
        groups, cursor = [], 0
        for q in examples:
            groups.append((scores[cursor : cursor + len(q.texts)], q.labels))
            cursor += len(q.texts)
        return ranking_metrics(groups)

    def score(self, metrics: dict) -> float:
        return 100.0 * float(metrics["mrr"])  # a fraction in the task's metrics

    def summary(self, metrics: dict) -> str:
        return f"rerank MRR {self.score(metrics):.2f} / recall@1 {100 * metrics['recall_at_1']:.2f} %"

    def embed_texts(self, examples: list) -> dict[str, list[str]]:
        return {
            f"{self.name}_queries": [q.query for q in examples],
            f"{self.name}_texts": list(dict.fromkeys(t for q in examples for t in q.texts)),
        }


TASK = RerankTask()
