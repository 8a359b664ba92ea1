"""A checkpoint copy holding calibration.jsonl as training writes it (training/calibration.py), made from the
*training* splits (SST-2 train, CoNLL-2003 train, SQuAD's training articles), so that agreement measured on SST-2
dev, CoNLL valid and the held-out SQuAD articles (the demo model's evaluation data) stays held out (docs/export.md,
"A checkpoint's own calibration text").

    python -m evals.own_calibration --ckpt serving/demo_model --out DIR [--tasks classify[,ner,qa,rerank]]
                                    [--data ../shared/data] [--pool 4096]
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

from bert.checkpoint import CALIBRATION_FILE
from bert.tasks import registry
from bert.tokenizer import BertTokenizer
from training.calibration import calibration_file, merged
from training.finetune import FinetuneConfig

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tasks", default="classify", help="comma list of classify, ner, qa, rerank")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--pool", type=int, default=4096, help="random SST-2 train examples the file is taken from")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    tokenizer = BertTokenizer.from_dir(args.ckpt)
    files = []
    for name in args.tasks.split(","):
        train_data, extra = {
            "classify": (args.data / "SST-2" / "train.tsv", {}),
            "ner": (args.data / "conll2003" / "train.txt", {}),
            "qa": (args.data / "squad-train", {"heldout_articles": 10, "max_seq_length": 384}),  # demo.sh's
            # recipes/rerank_squad.sh's: each question against its paragraph's sentences
            "rerank": (f"squad:{args.data / 'squad-train'}", {"heldout_articles": 10, "max_seq_length": 96}),
        }[name]
        cfg = FinetuneConfig(
            task=name, ckpt=str(args.ckpt), train_data=str(train_data), eval_data=str(train_data), **extra
        )
        task = registry.get(name)
        train, _ = task.read_examples(cfg)
        labels = task.train_labels(cfg, train, [])
        picked = random.Random(args.seed).sample(train, min(args.pool, len(train)))
        files.append(calibration_file(tokenizer, task, picked, labels, cfg))
    text = merged(files) if len(files) > 1 else files[0]
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(args.ckpt, args.out)
    (args.out / CALIBRATION_FILE).write_text(text, encoding="utf-8")
    print(f"{args.out / CALIBRATION_FILE}: {len(text.splitlines())} inputs")


if __name__ == "__main__":
    main()
