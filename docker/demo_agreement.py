"""How closely an ONNX export of the demo model agrees with the demo checkpoint run by torch in fp32, on
held-out data: the check behind the precision the CPU image exports the demo model at (Dockerfile).

    python docker/demo_agreement.py ARTIFACT_DIR [ARTIFACT_DIR ...] [--limit N]

Per artifact, on the same inputs as the torch fp32 reference:
- qa: every window of the questions of the 10 held-out SQuAD articles; agreement of the argmax start and
  end token over the context, of the final answer span, and SQuAD F1 of both;
- classify: SST-2 dev sentences, agreement of the predicted label;
- ner: CoNLL-2003 valid sentences, agreement of the per-token label.
Needs torch and ../shared/data (BERTSERVE_TEST_DATA): a measurement, not part of the image.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("BERTSERVE_TEST_DATA", REPO.parent / "shared" / "data"))


def run_batched(backend, features, batch_size=16):
    from bert.tasks import pad_batch

    order = sorted(range(len(features)), key=lambda i: len(features[i]))
    outputs: list[dict] = [None] * len(features)  # type: ignore[list-item]
    for first in range(0, len(order), batch_size):
        rows = order[first : first + batch_size]
        out = backend.run(pad_batch([features[i] for i in rows]))
        for j, i in enumerate(rows):
            outputs[i] = {k: v[j] for k, v in out.items()}
    return outputs


def load_backend(path: Path):
    from runtime.backends import create_backend
    from runtime.model_dir import read_model_spec
    from serving.settings import Settings

    return create_backend(read_model_spec(path), Settings(threads=2, inference_workers=1))


def qa_inputs(tokenizer, limit):
    from bert.tasks import qa
    from training.data.readers import read_squad_articles, split_heldout, squad_examples

    _, heldout = split_heldout(read_squad_articles(DATA / "squad-train"), 10)
    examples = squad_examples(heldout)[: limit or None]
    windows = [qa.encode(tokenizer, e.question, e.context) for e in examples]
    return examples, windows


def qa_scores(examples, windows, outputs):
    from bert.tasks import qa
    from training import metrics as M

    starts, ends, answers, k = [], [], {}, 0
    for example, wins in zip(examples, windows):
        out = outputs[k : k + len(wins)]
        k += len(wins)
        for window, o in zip(wins, out):
            positions = np.array(list(window.context_positions))
            starts.append(int(positions[np.argmax(o["qa_start"][: len(window)][positions])]))
            ends.append(int(positions[np.argmax(o["qa_end"][: len(window)][positions])]))
        best = qa.decode(example.context, wins, [o["qa_start"] for o in out], [o["qa_end"] for o in out])[0]
        answers[example.id] = (best["start"], best["end"], best["answer"])
    f1 = M.squad_metrics(
        {i: a[2] for i, a in answers.items()}, {e.id: [a["text"] for a in e.answers] for e in examples}
    )["f1"]
    return np.array(starts), np.array(ends), answers, f1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--checkpoint", type=Path, default=REPO / "serving" / "demo_model")
    parser.add_argument("--limit", type=int, default=0, help="first N inputs of each task (quick runs)")
    args = parser.parse_args()

    from bert.tasks import classify, ner
    from bert.tokenizer import BertTokenizer
    from training.data.readers import read_conll

    tokenizer = BertTokenizer.from_dir(args.checkpoint)
    examples, windows = qa_inputs(tokenizer, args.limit)
    qa_features = [w for wins in windows for w in wins]
    sst2 = [line.split("\t")[0] for line in (DATA / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    sst2 = sst2[: args.limit or None]
    conll = [" ".join(s.words) for s in read_conll(DATA / "conll2003" / "valid.txt")][: args.limit or None]
    classify_features = classify.encode(tokenizer, sst2)
    ner_features = ner.encode(tokenizer, conll, truncate=True)
    print(
        f"{len(examples)} questions ({len(qa_features)} windows), {len(sst2)} SST-2, {len(conll)} CoNLL sentences",
        flush=True,
    )

    def predictions(path):
        backend = load_backend(path)
        qa_out = run_batched(backend, qa_features)
        classify_out = run_batched(backend, classify_features)
        ner_out = run_batched(backend, ner_features)
        tokens = np.concatenate([o["ner"][: len(f)].argmax(-1)[1:-1] for o, f in zip(ner_out, ner_features)])
        return (*qa_scores(examples, windows, qa_out), np.array([o["classify"].argmax() for o in classify_out]), tokens)

    ref_starts, ref_ends, ref_answers, ref_f1, ref_labels, ref_tokens = predictions(args.checkpoint)
    print(f"torch fp32 reference: SQuAD F1 {ref_f1:.2f}")
    print(
        f"| artifact | precision | QA start | QA end | QA answer span | SQuAD F1 (fp32 {ref_f1:.2f}) | SST-2 label | "
        "CoNLL token label |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for path in args.artifacts:
        starts, ends, answers, f1, labels, tokens = predictions(path)
        same_span = np.mean([answers[i][:2] == ref_answers[i][:2] for i in ref_answers])
        manifest = json.loads((path / "manifest.json").read_text())
        scope = manifest.get("quantization", {}).get("scope", "")
        precision = manifest["precision"] + (" " + scope if scope else "")
        print(
            f"| {path.name} | {precision} | {np.mean(starts == ref_starts):.2%} | {np.mean(ends == ref_ends):.2%} "
            f"| {same_span:.2%} | {f1:.2f} | {np.mean(labels == ref_labels):.2%} "
            f"| {np.mean(tokens == ref_tokens):.2%} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
