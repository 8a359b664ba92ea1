"""The default exports (precision auto) agree with fp32 on held-out data: the demo model's SST-2 labels, CoNLL-2003
entity spans and SQuAD answers, all-MiniLM-L6-v2's embeddings, and a trained reranker's top-1 sentence per held-out
SQuAD question where BERTSERVE_TEST_RERANKER names one (evals/int8_agreement.py).

Each default export runs the int8 search (minutes on 2 cores), so this runs only with BERTSERVE_TEST_FULL=1, on
samples of each set (the first 200 SST-2 dev sentences, 300 CoNLL valid sentences, 100 held-out SQuAD
questions); the full figures are in docs/export.md ("Default exports on held-out data")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("BERTSERVE_TEST_FULL") != "1", reason="BERTSERVE_TEST_FULL=1: each default export takes minutes"
)
REPO = Path(__file__).resolve().parents[1]
BARS = {
    "classify (SST-2 dev labels)": 0.995,
    "ner (CoNLL-2003 valid entity spans)": 0.99,
    "qa (SQuAD held-out answers)": 0.99,
    "embeddings (SST-2 dev cosine >= 0.99)": 1.0,
    "rerank (SQuAD held-out top-1 sentence)": 0.99,
    "rerank (SQuAD held-out top-1 of 20 article sentences)": 0.99,
}
# a trained reranker checkpoint (e.g. one trained on mined negatives, training/mine_rerank.py): read only
RERANKER = os.environ.get("BERTSERVE_TEST_RERANKER")


def pair_figures(default: Path, data_dir: Path) -> dict:
    """The default export's int8 graph with its fp32 graph answering again what int8 is unsure of, as a server
    serves the directory: each decision (a label, a sentence's entity spans, an answer) against fp32's."""
    from evals.int8_agreement import conll, squad_heldout, sst2
    from export import verified

    rows = {"classify": sst2(data_dir, 200), "ner": conll(data_dir, 300), "qa": squad_heldout(data_dir, 100)}
    keys = {
        "classify": "classify (SST-2 dev labels)",
        "ner": "ner (CoNLL-2003 valid entity spans)",
        "qa": "qa (SQuAD held-out answers)",
    }
    found = verified.measure(default, default / "verify", list(rows), None, 256, rows=rows)
    return {keys[task]: {**figures, "pair": True} for task, figures in found.tasks.items()}


def exports(source, tmp_path):
    from export.onnx import cli

    default, fp32 = tmp_path / "default", tmp_path / "fp32"
    common = ["--ckpt", str(source), "--max-seq", "256"]
    assert cli([*common, "--precision", "auto", "--int8-scope", "auto", "--out", str(default)]) == 0
    assert cli([*common, "--precision", "fp32", "--out", str(fp32)]) == 0
    return fp32, default


@pytest.mark.parametrize("model", ["demo", "minilm", "rerank"])
def test_default_export_agrees_with_fp32_on_heldout_data(model, tmp_path, data_dir, minilm_dir, record_property):
    from evals.int8_agreement import compare

    if model == "rerank" and not RERANKER:
        pytest.skip("BERTSERVE_TEST_RERANKER: a trained reranker checkpoint directory")
    source = {"demo": REPO / "serving" / "demo_model", "minilm": minilm_dir, "rerank": RERANKER}[model]
    fp32, default = exports(source, tmp_path)
    figures = compare(fp32, default, data_dir, 200, ner_limit=300, qa_limit=100)
    assert figures
    if (default / "verify").is_dir():  # the pair (export/verified.py): its answers are the server's, not the graph's
        figures |= pair_figures(default, data_dir)
    for what, figure in figures.items():
        record_property(what, figure["agreement"])
        print(f"{model} {what}: {figure}")
        assert figure["agreement"] >= BARS[what], (what, figure)
