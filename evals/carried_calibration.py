"""A checkpoint copy carrying calibration.jsonl as training writes it (training/calibration.py), made from SST-2
*train* examples, so that agreement measured on SST-2 dev (the demo classifier's evaluation split) stays held out
(docs/export.md, "Calibration text a checkpoint carries").

    python -m evals.carried_calibration --ckpt serving/demo_model --out DIR [--data ../shared/data] [--pool 4096]
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

from bert.checkpoint import CALIBRATION_FILE
from bert.tasks import registry
from bert.tokenizer import BertTokenizer
from training.calibration import calibration_file
from training.finetune import FinetuneConfig

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--pool", type=int, default=4096, help="random SST-2 train examples the file is taken from")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    train_tsv = str(args.data / "SST-2" / "train.tsv")
    cfg = FinetuneConfig(task="classify", ckpt=str(args.ckpt), train_data=train_tsv, eval_data=train_tsv)
    task = registry.get("classify")
    train, _ = task.read_examples(cfg)
    labels = task.train_labels(cfg, train, train)
    picked = random.Random(args.seed).sample(train, min(args.pool, len(train)))
    text = calibration_file(BertTokenizer.from_dir(args.ckpt), task, picked, labels, cfg)
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(args.ckpt, args.out)
    (args.out / CALIBRATION_FILE).write_text(text, encoding="utf-8")
    print(f"{args.out / CALIBRATION_FILE}: {len(text.splitlines())} inputs")


if __name__ == "__main__":
    main()
