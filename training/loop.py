"""The training loop every run shares (nanoGPT style: one function you can read top to bottom).

AdamW without decay on biases/LayerNorm, linear warmup + linear decay, gradient accumulation,
clipping, autocast (bf16/fp16, GradScaler for fp16), periodic evaluation, best/ and last/ checkpoints,
exact resume from last/ (weights, optimizer, schedule position, RNG states, data position), a tqdm
bar with loss / lr / tokens/s, a JSONL log, and DistributedDataParallel under torchrun.

The data side is a `TrainData`: `batches(epoch)` returns the epoch's global batches (lists of example
indices, a pure function of seed and epoch), and `collate(indices, rng)` builds tensors; `rng` is a
numpy Generator seeded from (seed, epoch, batch) so dynamic masking is reproducible and resumable.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from bert.atomic import old_copy, pause_point, publish_dir, recover, remove_stale_temporaries, write_file_atomic
from bert.checkpoint import CheckpointError, read_state_dict, save_torch_file, verify_manifest, write_manifest
from bert.errors import EXIT_INTERRUPTED, one_line
from training.config import ConfigError, resolve_device

if TYPE_CHECKING:
    from bert.tokenizer import BertTokenizer

TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.pt"


class TrainData(Protocol):
    def batches(self, epoch: int) -> list[list[int]]: ...
    def collate(self, indices: list[int], rng: np.random.Generator) -> dict[str, torch.Tensor]: ...


# ----------------------------------------------------------------------------- schedule and optimizer


def learning_rate_at(step: int, *, peak: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup from 0 to `peak` over warmup_steps, then linear decay to 0 at total_steps.
    `step` counts optimizer steps already taken (the lr used for step number step + 1)."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    remaining = total_steps - step
    return peak * max(0.0, remaining / max(1, total_steps - warmup_steps))


def no_decay(name: str) -> bool:
    # pre-norm blocks name theirs attention_norm, mlp_norm, final_norm
    return name.endswith(".bias") or "LayerNorm" in name or "layer_norm" in name or "_norm." in name


def make_optimizer(model: torch.nn.Module, cfg) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not no_decay(n)]
    plain = [p for n, p in model.named_parameters() if p.requires_grad and no_decay(n)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    # The fused kernel updates all parameters in one pass, several times faster than foreach on CPU
    # (docs/training.md, "Batching"). Same maths, same state dict.
    fused = all(p.device.type in ("cpu", "cuda") for p in decay + plain)
    return torch.optim.AdamW(
        groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon, fused=fused or None
    )


# ----------------------------------------------------------------------------- processes and devices


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device_name: str) -> tuple[Dist, torch.device]:
    """Under torchrun (WORLD_SIZE > 1): init the process group (nccl on GPU, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device_name = resolve_device(device_name)
    if device_name == "cuda":
        device_name = f"cuda:{local}"
    device = torch.device(device_name)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(device)
    return Dist(rank, world, local), device


def _mean_across(value: float, dist: Dist) -> float:
    if dist.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return float(t.item()) / dist.world_size


def _sum_across(value: int, dist: Dist) -> int:
    if dist.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return int(t.item())


def _barrier(dist: Dist) -> None:
    if dist.world_size > 1:
        torch.distributed.barrier()


# ----------------------------------------------------------------------------- checkpoint + resume


def check_init_checkpoint(ckpt: str) -> None:
    """A run that starts from --ckpt checks it (config, weight files, sizes) before it reads any data: a
    bad checkpoint is one line at once, not a traceback after minutes of tokenising."""
    if ckpt:
        from bert.checkpoint import check_checkpoint
        from bert.model import BertModel

        check_checkpoint(ckpt, BertModel)  # the encoder every run starts from; heads may start fresh


def start_run(cfg) -> tuple["Dist", torch.device, "BertTokenizer"]:
    """The first steps of the fine-tuning CLIs: the checkpoint checked, torch threads, the process group,
    and the tokenizer (--tokenizer, else the checkpoint's own)."""
    from bert.checkpoint import resolve_checkpoint
    from bert.tokenizer import BertTokenizer

    check_init_checkpoint(cfg.ckpt)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    dist, device = setup_distributed(cfg.device)
    return dist, device, BertTokenizer.from_dir(cfg.tokenizer or resolve_checkpoint(cfg.ckpt))


def finish_run(
    dist: "Dist", output_dir: str | Path, summary: dict | None, printed: dict | None = None, *, interrupted=False
) -> int:
    """The last step of every training CLI: metrics.json and one JSON line on stdout from the main
    process (`printed`, default the summary itself), then leave the process group. Returns exit code 0, or
    130 for a run stopped by Ctrl-C (`interrupted`: its last/ is saved and the note on stderr says how to
    resume; stdout stays empty, so `finetune && export` stops there)."""
    if dist.main and summary is not None:
        write_file_atomic(Path(output_dir) / "metrics.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
        if not interrupted:
            print(json.dumps(summary if printed is None else printed, sort_keys=True))
    if dist.world_size > 1:
        _barrier(dist)  # no process tears its connections down while another still writes or talks
        torch.distributed.destroy_process_group()
    return EXIT_INTERRUPTED if interrupted else 0


def save_trainer_state(directory: Path, *, optimizer, scaler, state: dict, rank_rngs: list | None = None) -> None:
    """Everything besides the weights that exact resume needs. Tensors go to optimizer.pt (loadable
    with weights_only=True); counters and the Python/numpy RNG states to trainer_state.json; under
    torchrun each process's dropout RNG to rng_rank<N>.pt. Then checkpoint.json names the step and every
    file, so that resume can tell that weights, optimizer and trainer state belong together."""
    save_torch_file(
        {
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
        directory / OPTIMIZER_STATE,
    )
    pause_point(f"{directory.name}:optimizer", partial=directory / OPTIMIZER_STATE)
    for rank, blob in enumerate(rank_rngs or []):
        save_torch_file(blob, directory / f"rng_rank{rank}.pt")
    payload = dict(state, python_rng=_jsonable(random.getstate()), numpy_rng=_jsonable(np.random.get_state()))
    (directory / TRAINER_STATE).write_text(json.dumps(payload, indent=1) + "\n")
    pause_point(f"{directory.name}:state", partial=directory / TRAINER_STATE)
    write_manifest(directory, step=state["step"], epoch=state["epoch"], position=state["position"])
    pause_point(f"{directory.name}:manifest")


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


def _from_json(value):
    if isinstance(value, dict) and "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=value["dtype"])
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
    return value


def resume_directory(requested: Path) -> Path:
    """The directory --resume names, or the previous copy when a save was killed between its two renames
    (bert.atomic.recover puts it back, and one line says so)."""
    replaced = not requested.is_dir() and old_copy(requested).is_dir()
    found = recover(requested)
    if found is None:
        raise CheckpointError(
            f"--resume {requested}: no such directory (nor a previous copy {old_copy(requested).name} beside it)"
        )
    if replaced:
        print(
            f"resume: {requested} was being replaced when the run stopped; using the previous copy "
            f"({old_copy(requested).name}, now {found})",
            file=sys.stderr,
        )
    elif old_copy(requested).is_dir():  # killed after the new copy was in place: the old one is stale
        shutil.rmtree(old_copy(requested), ignore_errors=True)
    remove_stale_temporaries(requested)
    return found


def _why(error: BaseException) -> str:
    return one_line(error, 200) or type(error).__name__


def load_trainer_state(directory: Path, *, model, optimizer, scaler, device) -> dict:
    """Restore weights, optimizer and RNGs from a last/ directory and return its counters. The directory's
    checkpoint.json must list every file with its size and sha256 and the step trainer_state.json says:
    weights, optimizer and trainer state from one step, or a CheckpointError naming the file and why."""
    manifest = verify_manifest(directory)
    if manifest is None:
        print(
            f"resume: {directory} has no checkpoint.json (saved by an older version); its files are not verified",
            file=sys.stderr,
        )
    path = directory / TRAINER_STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"--resume: {path} is not readable JSON: {_why(e)}") from None
    if not isinstance(state, dict) or not all(k in state for k in ("step", "epoch", "position", "python_rng")):
        raise CheckpointError(f"--resume: {path} lacks the step, epoch, position or RNG state of a trainer")
    if manifest is not None and manifest.get("step") != state["step"]:
        raise CheckpointError(
            f"--resume: {path} is at step {state['step']} but {directory / 'checkpoint.json'} "
            f"says step {manifest.get('step')}: not one save"
        )
    weights = read_state_dict(directory)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.startswith("cls.predictions.decoder")]  # tied to embeddings
    if missing or unexpected:
        raise CheckpointError(
            f"--resume {directory}: weights do not match the model (missing {missing[:8]}, unexpected {unexpected[:8]})"
        )
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    path = directory / OPTIMIZER_STATE
    if path.is_file() and path.stat().st_size == 0:
        raise CheckpointError(f"--resume: {path} is empty (0 bytes): the save that wrote it did not finish")
    try:
        blob = torch.load(path, map_location=device, weights_only=True)
        optimizer.load_state_dict(blob["optimizer"])
    except Exception as e:  # noqa: BLE001 - a missing, truncated or foreign file: UnpicklingError, RuntimeError, ...
        raise CheckpointError(f"--resume: {path} cannot be read: {_why(e)}") from None
    if scaler is not None and blob.get("scaler"):
        scaler.load_state_dict(blob["scaler"])
    torch.set_rng_state(blob["torch_rng"].cpu())
    if blob.get("cuda_rng") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in blob["cuda_rng"]])
    random.setstate(_from_json(state.pop("python_rng")))
    np.random.set_state(_from_json(state.pop("numpy_rng")))
    return state


def planned_steps(cfg, steps_per_epoch: int) -> int:
    """The run's length in optimizer steps: --max-steps, else --num-epochs of the data's steps per epoch."""
    return cfg.max_steps or math.ceil(cfg.num_epochs * steps_per_epoch)


def resumed_plan_problem(cfg, saved_total, total_steps: int) -> None:
    """A resumed run must plan the steps the saved one planned (the schedule and data order depend on it)."""
    if saved_total != total_steps:
        raise ConfigError(
            f"--resume {cfg.resume}: that run planned {saved_total} steps, "
            f"this config plans {total_steps}; resume with the same options"
        )


def check_resume_plan(cfg, steps_per_epoch: int) -> None:
    """What train() checks once it has loaded the model, checked by the CLIs as soon as the data is read:
    --resume of a run whose planned length differs (e.g. other training data under the same options) is one
    line before the model is built. No-op without --resume or when the saved state cannot be read (train()'s
    resume then says why)."""
    if not cfg.resume or steps_per_epoch == 0:
        return
    for directory in (Path(cfg.resume), old_copy(Path(cfg.resume))):
        try:
            state = json.loads((directory / TRAINER_STATE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and "total_steps" in state:
            resumed_plan_problem(cfg, state["total_steps"], planned_steps(cfg, steps_per_epoch))
        return


# ----------------------------------------------------------------------------- the loop


def batch_rng(seed: int, epoch: int, batch: int) -> np.random.Generator:
    """The RNG a batch's collate uses (dynamic masking): a pure function of its position."""
    return np.random.default_rng([seed, epoch, batch])


def _to(batch: dict, device) -> dict:
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def train(
    cfg,
    model: torch.nn.Module,
    data: TrainData,
    *,
    save_model: Callable[[torch.nn.Module, Path], None],
    evaluate: Callable[[torch.nn.Module], dict] | None = None,
    best_metric: str | None = None,
    dist: Dist | None = None,
    device: torch.device | None = None,
    stop_at_step: int = 0,
    compute_loss: Callable[[torch.nn.Module, dict], torch.Tensor] | None = None,
    find_unused_parameters: bool = False,
) -> dict:
    """Train `model` on `data` as `cfg` says; returns {"step", "best", "last_eval"}.

    Writes <output_dir>/log.jsonl, last/ (weights + tokenizer + trainer state, resumable) and, when
    `evaluate` and `best_metric` are given, best/ with metrics.json. `stop_at_step` stops early as if
    interrupted (the schedule still spans the whole run), so a later --resume continues exactly.
    `compute_loss(model, batch)` replaces the default `model(**batch).loss` (multi-task: the batch
    names its task and the loss picks that head); `find_unused_parameters` goes to
    DistributedDataParallel (heads that a single-task batch leaves unused).
    """
    dist = dist or Dist()
    device = device or torch.device("cpu")
    out = Path(cfg.output_dir)
    if dist.main:
        out.mkdir(parents=True, exist_ok=True)
    model.to(device)
    if cfg.gradient_checkpointing:
        model.encoder_module().encoder.gradient_checkpointing = True
    optimizer = make_optimizer(model, cfg)
    use_autocast = cfg.precision in ("bf16", "fp16")
    amp_dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None

    steps_per_epoch = len(data.batches(0))
    if steps_per_epoch == 0:
        raise ConfigError(f"no full batch of {cfg.batch_size} examples in the training data")
    total_steps = planned_steps(cfg, steps_per_epoch)
    warmup = cfg.warmup_steps or int(cfg.warmup_ratio * total_steps)

    step, epoch, position = 0, 0, 0
    best = None
    last_eval: dict = {}
    if cfg.resume:
        resume_dir = Path(cfg.resume)
        if dist.main:
            resume_dir = resume_directory(resume_dir)
        _barrier(dist)
        resume_dir = recover(resume_dir) or resume_dir  # the other processes: what the main one recovered
        state = load_trainer_state(resume_dir, model=model, optimizer=optimizer, scaler=scaler, device=device)
        step, epoch, position = state["step"], state["epoch"], state["position"]
        best, last_eval = state.get("best"), state.get("last_eval", {})
        rank_rng = resume_dir / f"rng_rank{dist.rank}.pt"
        if dist.world_size > 1 and rank_rng.is_file() and state.get("world_size") == dist.world_size:
            blob = torch.load(rank_rng, map_location="cpu", weights_only=True)
            torch.set_rng_state(blob["torch_rng"])
            if blob.get("cuda_rng") is not None and device.type == "cuda":
                torch.cuda.set_rng_state(blob["cuda_rng"], device)
        resumed_plan_problem(cfg, state.get("total_steps"), total_steps)

    train_model = model
    if dist.world_size > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=find_unused_parameters,
        )
    micro_per_rank = cfg.grad_accum_steps

    def log(record: dict) -> None:
        if dist.main:
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def save_last(reason: str) -> None:
        rank_rngs = None
        if dist.world_size > 1:  # every process has its own dropout RNG stream; all go into the one last/
            rank_rngs = [None] * dist.world_size
            torch.distributed.all_gather_object(
                rank_rngs,
                {
                    "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                },
            )
        if dist.main:
            with publish_dir(out / "last") as directory:  # weights, optimizer and state published together
                save_model(model, directory)
                save_trainer_state(
                    directory,
                    optimizer=optimizer,
                    scaler=scaler,
                    rank_rngs=rank_rngs,
                    state={
                        "step": step,
                        "epoch": epoch,
                        "position": position,
                        "total_steps": total_steps,
                        "best": best,
                        "last_eval": last_eval,
                        "reason": reason,
                        "config": cfg.to_dict(),
                        "world_size": dist.world_size,
                    },
                )
        _barrier(dist)

    def run_eval() -> None:
        nonlocal best, last_eval
        if evaluate is not None and dist.main:
            model.eval()
            metrics = evaluate(model)
            model.train()
            last_eval = metrics
            log({"step": step, "epoch": epoch, "eval": metrics})
            if best_metric is not None:
                value = metrics[best_metric]
                if best is None or value > best["value"]:
                    best = {"value": value, "step": step, "metric": best_metric}
                    with publish_dir(out / "best") as directory:  # the weights and the score that claims them
                        save_model(model, directory)
                        (directory / "metrics.json").write_text(
                            json.dumps(dict(metrics, step=step, epoch=epoch), indent=2, sort_keys=True) + "\n"
                        )
                        pause_point("best:metrics", partial=directory / "metrics.json")
                        write_manifest(directory, step=step)
                    if bar is not None:
                        bar.write(f"step {step}: new best {best_metric} = {value:.4f}")
        _barrier(dist)

    bar = None
    if dist.main and cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, initial=step, dynamic_ncols=True, desc="train")

    model.train()
    window_losses, window_tokens, window_start = [], 0, time.perf_counter()
    started = time.perf_counter()
    finished = False
    step_rng = torch.get_rng_state()
    interrupted = False
    try:
        while not finished and step < total_steps:
            batches = data.batches(epoch)
            while position < len(batches):
                global_batch = batches[position]
                rank_part = global_batch[dist.rank :: dist.world_size]
                micro_batches = [rank_part[i::micro_per_rank] for i in range(micro_per_rank)]
                lr = learning_rate_at(step, peak=cfg.learning_rate, warmup_steps=warmup, total_steps=total_steps)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                rng = batch_rng(cfg.seed, epoch, position)
                step_rng = torch.get_rng_state()  # restored if Ctrl-C lands mid-step, so last/ stays exact
                loss_sum, tokens = 0.0, 0
                for m, indices in enumerate(micro_batches):
                    batch = _to(data.collate(sorted(indices), rng), device)
                    tokens += int(batch["attention_mask"].sum())
                    sync = m == len(micro_batches) - 1 or dist.world_size == 1
                    context = contextlib.nullcontext() if sync else train_model.no_sync()
                    with context:
                        with torch.autocast(device.type, dtype=amp_dtype, enabled=use_autocast):
                            loss = (
                                compute_loss(train_model, batch)
                                if compute_loss is not None
                                else train_model(**batch).loss
                            ) / len(micro_batches)
                        (scaler.scale(loss) if scaler else loss).backward()
                    loss_sum += float(loss.detach())
                if scaler:
                    scaler.unscale_(optimizer)
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                position += 1

                loss_value = _mean_across(loss_sum, dist)
                window_losses.append(loss_value)
                window_tokens += _sum_across(tokens, dist)
                if bar is not None:
                    elapsed = time.perf_counter() - window_start
                    bar.update(1)
                    bar.set_postfix(
                        loss=f"{loss_value:.4f}",
                        lr=f"{lr:.2e}",
                        tok_s=f"{window_tokens / max(elapsed, 1e-9):.0f}",
                        epoch=epoch,
                    )
                if step % cfg.log_every == 0 or step == total_steps:
                    elapsed = time.perf_counter() - window_start
                    log(
                        {
                            "step": step,
                            "epoch": epoch,
                            "loss": loss_value,
                            "loss_avg": sum(window_losses) / len(window_losses),
                            "lr": lr,
                            "tokens_per_s": window_tokens / max(elapsed, 1e-9),
                            "elapsed_s": time.perf_counter() - started,
                        }
                    )
                    window_losses, window_tokens, window_start = [], 0, time.perf_counter()

                end_of_epoch = position == len(batches)
                if end_of_epoch:  # the saved position must point at the next batch to run
                    epoch, position = epoch + 1, 0
                eval_due = (cfg.eval_every and step % cfg.eval_every == 0) or (not cfg.eval_every and end_of_epoch)
                if eval_due or step == total_steps:
                    run_eval()
                save_due = (cfg.save_every and step % cfg.save_every == 0) or (not cfg.save_every and eval_due)
                if step == total_steps or (stop_at_step and step == stop_at_step):
                    save_last("end" if step == total_steps else "stopped")
                    finished = True
                    break
                if save_due:
                    save_last("periodic")
                if end_of_epoch:
                    break
    except KeyboardInterrupt:
        if dist.world_size > 1:
            raise
        interrupted = True  # Ctrl-C: keep everything up to the last completed step in last/
        optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(step_rng)
        save_last("interrupted")
    if bar is not None:
        bar.close()
    if interrupted and dist.main:  # a note, not the result: stderr (the CLIs then exit 130)
        print(f"interrupted after step {step}; continue with --resume {out / 'last'}", file=sys.stderr)
    return {
        "step": step,
        "total_steps": total_steps,
        "best": best,
        "last_eval": last_eval,
        "interrupted": interrupted,
    }
