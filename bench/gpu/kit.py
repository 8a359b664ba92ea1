"""The GPU benchmark in one command, on a CUDA machine with the checkout and the bundle from
`python -m bench.gpu.prepare` copied there: `python3 -m bench.gpu.kit --out DIR` (README.md beside this).

Steps, in order of value, each a subprocess with its own JSON, merged into DIR/results.json as soon as
it ends (a timeout loses only the step in progress):
  tests   pytest -m gpu over every test file that has GPU-marked tests
  demo    recipes/demo.sh on the GPU (2 epochs of SST-2, CoNLL, SQuAD), the new demo model in tar parts
  model   BERT-large / BERT-base: bertserve's torch backend against transformers SDPA fp16 (model_level.py)
  server  the demo model behind bertserve and behind a FastAPI + transformers server, 1/32/256 clients

All four run within --budget-s, each started only when its minimum fits what is left (the rest are
'deferred'); tests run while the demo step reads its data (CPU), never beside a benchmark. Where one
command may only run for a while, give it that --budget-s and run it again with --phase 2: that runs
what the first run did not finish, read from the previous results (the work folder when it is still
there, else <kit>/previous.json, a copy of the first run's results.json), and without them
`model,server`. --steps names the steps outright. --dry-run: the same on CPU, tiny.

DIR gets a handful of plain files: results.json, log.txt, profile.txt, demo_model.tar.part-00.. (each at
most the demo step's --part-mib).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORDER = ("tests", "demo", "model", "server")
# Seconds a step needs at least to be worth starting on the GPU machine (README.md beside this gives what
# each took there; the dry run's are for 2 CPU cores).
MINIMUM = {"tests": 60, "demo": 300, "model": 120, "server": 100}
MINIMUM_DRY = {"tests": 10, "demo": 20, "model": 10, "server": 20}
# Longest a step may run however much budget is left (a hung test must not eat the demo's run).
CAP = {"tests": 300}


class Kit:
    def __init__(self, args):
        self.args = args
        self.started = time.time()
        self.deadline = self.started + args.budget_s
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.kit = Path(args.kit)
        self.log = open(self.out / "log.txt", "a", encoding="utf-8")
        self.minimum = MINIMUM_DRY if args.dry_run else MINIMUM
        self.results: dict = {
            "phase": args.phase,
            "dry_run": args.dry_run,
            "budget_s": args.budget_s,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "steps": {},
        }
        self.env = dict(os.environ)
        self.before = self.previous()  # read before this run writes its own results into --work

    # ---- output ---------------------------------------------------------------------------
    def say(self, text: str) -> None:
        line = f"[kit {time.time() - self.started:6.0f}s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.time() - self.started, 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=2) + "\n")
        tmp.replace(self.out / "results.json")
        (self.work / "results.json").write_text(json.dumps(self.results, indent=2) + "\n")

    def left(self) -> float:
        return self.deadline - time.time()

    # ---- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        manifest = self.kit / "manifest.json"
        if not manifest.is_file():
            raise SystemExit(
                f"kit: {manifest} missing: run `python -m bench.gpu.prepare` where the data and a "
                "package index are, and copy the folder it writes here (--kit)"
            )
        info = json.loads(manifest.read_text())
        self.results["kit"] = {k: info.get(k) for k in ("created", "commit", "tiny", "kit_mib", "squad_windows")}
        site = self.work / "site"
        wheels = sorted(self.kit.glob("wheels/*.whl"))
        if wheels:
            stamp = site / ".installed"
            names = "\n".join(w.name for w in wheels)
            if not stamp.is_file() or stamp.read_text() != names:
                self.say(f"installing {len(wheels)} wheels into {site}")
                shutil.rmtree(site, ignore_errors=True)
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "install",
                        "-q",
                        "--no-index",
                        "--no-deps",
                        "--no-compile",
                        "--no-cache-dir",
                        "--disable-pip-version-check",
                        "--target",
                        str(site),
                        *map(str, wheels),
                    ],
                    check=True,
                )
                stamp.write_text(names)
        paths = [str(site)] if wheels else []
        self.env["PYTHONPATH"] = os.pathsep.join(
            paths + [str(REPO)] + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else [])
        )
        data = self.work / "data"
        digest = info["files"]["data.tar.xz"]["sha256"]
        if not (data / ".unpacked").is_file() or (data / ".unpacked").read_text() != digest:
            shutil.rmtree(data, ignore_errors=True)
            data.mkdir(parents=True)
            with tarfile.open(self.kit / "data.tar.xz") as tar:
                tar.extractall(data, filter="data")
            (data / ".unpacked").write_text(digest)
        self.env.update(
            BERTSERVE_TEST_DATA=str(data),
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        self.results["machine"] = self.machine()
        self.save()

    def machine(self) -> dict:
        probe = (
            "import json, platform, torch\n"
            "d = {'python': platform.python_version(), 'torch': torch.__version__,"
            " 'cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available()}\n"
            "if torch.cuda.is_available():\n"
            "    p = torch.cuda.get_device_properties(0)\n"
            "    d.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), sm_count=p.multi_processor_count)\n"
            "from importlib.metadata import version, PackageNotFoundError\n"
            "for name in ('transformers', 'fastapi', 'pydantic', 'uvicorn', 'onnxruntime'):\n"
            "    try: d[name] = version(name)\n"
            "    except PackageNotFoundError: d[name] = None\n"
            "print(json.dumps(d))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", probe], env=self.env, capture_output=True, text=True, timeout=120
        )
        info = (
            json.loads(result.stdout.strip().splitlines()[-1])
            if result.returncode == 0
            else {"probe_error": result.stderr[-500:]}
        )
        smi = shutil.which("nvidia-smi")
        if smi:
            info["nvidia_smi"] = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        info["cpus"] = os.cpu_count()
        self.say(f"machine: {json.dumps(info)}")
        return info

    # ---- which steps ----------------------------------------------------------------------
    def previous(self) -> dict:
        for path in ([Path(self.args.previous)] if self.args.previous else []) + [
            self.work / "results.json",
            self.kit / "previous.json",
        ]:
            if path.is_file():
                try:
                    return json.loads(path.read_text()).get("steps", {})
                except (json.JSONDecodeError, AttributeError):
                    continue
        return {}

    def plan(self) -> list[str]:
        steps = self._steps()
        for name, record in self.before.items():  # kept, so that results.json holds the whole proof
            if name not in steps and record.get("status") == "ok":
                self.results["steps"][name] = dict(record, kept_from="previous run")
        return steps

    def _steps(self) -> list[str]:
        if self.args.steps:
            steps = [s.strip() for s in self.args.steps.split(",") if s.strip()]
            unknown = [s for s in steps if s not in ORDER]
            if unknown:
                raise SystemExit(f"kit: unknown steps {unknown}; steps are {', '.join(ORDER)}")
            return [s for s in ORDER if s in steps]
        if self.args.phase in ("1", "all"):
            return list(ORDER)
        before = self.before
        if not before:
            return ["model", "server"]
        retry = {"deferred", "interrupted", "timeout", None}
        return [s for s in ORDER if s != "tests" and before.get(s, {}).get("status") in retry]

    # ---- running --------------------------------------------------------------------------
    def command(self, step: str) -> list[str]:
        py, w, dry = sys.executable, self.work, ["--dry-run"] if self.args.dry_run else []
        deadline = ["--deadline", f"{self.deadline:.0f}"]
        if step == "tests":
            files = sorted(
                str(p.relative_to(REPO))
                for p in (REPO / "tests").glob("test_*.py")
                if "mark.gpu" in p.read_text(encoding="utf-8")
            )
            return [
                py,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "gpu",
                "-rfEs",
                f"--junitxml={w / 'tests.xml'}",
                *files,
            ]
        if step == "demo":
            return [
                py,
                "-m",
                "bench.gpu.demo_step",
                "--work",
                str(w),
                "--data",
                str(w / "data"),
                "--kit",
                str(self.kit),
                "--out",
                str(self.out),
                "--result",
                str(w / "demo.json"),
                *(["--part-mib", "3"] if self.args.dry_run else []),
                *deadline,
                *dry,
            ]
        if step == "model":
            return [
                py,
                "-m",
                "bench.gpu.model_level",
                "--windows",
                str(self.kit / "squad_windows.json"),
                "--out",
                str(w / "model.json"),
                "--profile",
                str(self.out / "profile.txt"),
                "--workdir",
                str(w / "model-checkpoints"),
                *deadline,
                *dry,
            ]
        if step == "server":
            model = (
                w / "demo_model" if (w / "demo_model" / "config.json").is_file() else REPO / "serving" / "demo_model"
            )
            return [
                py,
                "-m",
                "bench.gpu.server_level",
                "--model",
                str(model),
                "--data",
                str(w / "data"),
                "--out",
                str(w / "server.json"),
                "--logs",
                str(w / "server-logs"),
                *deadline,
                *dry,
            ]
        raise ValueError(step)

    def start(self, step: str, *, stream: bool) -> subprocess.Popen:
        cmd = self.command(step)
        self.say(f"step {step}: $ {' '.join(cmd)}")
        if stream:
            return subprocess.Popen(
                cmd,
                cwd=REPO,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        log = open(self.work / f"{step}-step.log", "w")
        return subprocess.Popen(
            cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait(self, step: str, proc: subprocess.Popen, started: float) -> None:
        """Stream (or later copy) the step's output into the log; stop it 20 s after the deadline."""
        timed_out = threading.Event()

        def stop() -> None:
            timed_out.set()
            for sig, grace in ((signal.SIGINT, 15), (signal.SIGKILL, 0)):
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        return
                    time.sleep(grace)

        timer = threading.Timer(max(1.0, min(self.left() + 20, started + CAP.get(step, 1e9) - time.time())), stop)
        timer.start()
        try:
            if proc.stdout is not None:
                for line in proc.stdout:
                    if "USDT:" in line or "Loading weights" in line:
                        continue  # the profiler's and transformers' progress noise
                    sys.stdout.write(line)
                    self.log.write(line)
                self.log.flush()
            proc.wait()
        finally:
            timer.cancel()
        own_log = self.work / f"{step}-step.log"
        if proc.stdout is None and own_log.is_file():
            self.log.write(f"---- output of step {step} ----\n{own_log.read_text(errors='replace')}")
            for extra in (self.work / "demo.log",) if step == "demo" else ():
                if extra.is_file():
                    self.log.write(f"---- {extra.name} ----\n{extra.read_text(errors='replace')[-200_000:]}")
            self.log.flush()
        self.record(step, proc.returncode, time.time() - started, timed_out.is_set())

    def record(self, step: str, returncode: int, seconds: float, timed_out: bool) -> None:
        detail = self.detail(step)
        reported = detail.pop("status", None)
        record = {
            "status": "ok" if returncode == 0 else "failed",
            "returncode": returncode,
            "seconds": round(seconds, 1),
            **detail,
        }
        if timed_out:
            record["status"] = "timeout"
        elif returncode != 0 and reported in ("interrupted", "failed"):
            record["status"] = reported
        elif step == "tests" and returncode == 5:  # pytest: nothing collected (no GPU-marked test selected)
            record["status"] = "ok"
        self.results["steps"][step] = record
        self.save()
        self.say(f"step {step}: {record['status']} in {seconds:.0f} s")

    def detail(self, step: str) -> dict:
        if step == "tests":
            return junit_summary(self.work / "tests.xml")
        path = self.work / f"{step}.json"
        if not path.is_file():
            return {}
        return json.loads(path.read_text())

    def defer(self, step: str) -> None:
        self.results["steps"][step] = {
            "status": "deferred",
            "reason": f"{self.left():.0f} s left, the step needs at least {self.minimum[step]} s",
        }
        self.save()
        self.say(f"step {step}: deferred ({self.left():.0f} s left)")

    def run(self) -> int:
        self.say(f"phase {self.args.phase}, budget {self.args.budget_s:.0f} s, out {self.out}, work {self.work}")
        self.setup()
        steps = self.plan()
        self.results["planned"] = steps
        self.say(f"steps: {', '.join(steps) or 'none'}")
        background: tuple[str, subprocess.Popen, float] | None = None
        if "demo" in steps and "tests" in steps and self.left() >= self.minimum["demo"]:
            # The demo step reads and encodes its data on the CPU for minutes: the tests run meanwhile.
            background = ("demo", self.start("demo", stream=False), time.time())
            steps.remove("demo")
        for step in steps:
            if self.left() < self.minimum[step]:
                self.defer(step)
                continue
            if step in ("model", "server") and background is not None:  # timings need the GPU to themselves
                self.wait(*background)
                background = None
                if self.left() < self.minimum[step]:
                    self.defer(step)
                    continue
            started = time.time()
            self.wait(step, self.start(step, stream=True), started)
        if background is not None:
            self.wait(*background)
        self.finish()
        # Deferred and interrupted steps are the budget's doing, not failures: phase 2 picks them up.
        return 1 if any(r.get("status") in ("failed", "timeout") for r in self.results["steps"].values()) else 0

    def finish(self) -> None:
        files = sorted(p for p in self.out.rglob("*") if p.is_file())
        self.results["files"] = [{"file": str(p.relative_to(self.out)), "bytes": p.stat().st_size} for p in files]
        self.save()
        self.say("summary:")
        for line in summary_lines(self.results):
            self.say("  " + line)
        self.log.close()


def junit_summary(path: Path) -> dict:
    if not path.is_file():
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    problems, skips = [], []
    for case in suite.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        for kind in ("failure", "error"):
            node = case.find(kind)
            if node is not None:
                problems.append({"test": name, kind: (node.get("message") or "")[:300]})
        node = case.find("skipped")
        if node is not None:
            skips.append({"test": name, "reason": (node.get("message") or "")[:200]})
    return dict(counts, problems=problems, skipped_tests=skips[:40])


def summary_lines(results: dict) -> list[str]:
    lines = []
    for name in ORDER:
        r = results["steps"].get(name)
        if r is None:
            continue
        line = f"{name:7s} {r.get('status')}"
        if name == "tests" and "tests" in r:
            line += f": {r['passed']} passed, {r['failures'] + r['errors']} failed, {r['skipped']} skipped"
        if name == "demo" and "scores" in r:
            s = r["scores"]
            line += (
                f": SST-2 {s['sst2_dev_accuracy']:.2f} %, CoNLL F1 {s['conll_valid_f1']:.2f}, SQuAD F1 "
                f"{s['squad_heldout_f1']:.2f} (backbone: {r['backbone']['what'][:60]}); "
                f"{len(r['package']['parts'])} parts"
            )
        if name == "model" and r.get("summary", {}).get("speedup"):
            line += ": " + ", ".join(f"{k} {v:.2f}x" for k, v in r["summary"]["speedup"].items())
        if name == "server" and r.get("speedup"):
            line += ": " + ", ".join(f"{k} clients {v:.2f}x" for k, v in r["speedup"].items())
        lines.append(line)
    lines.append(f"files: {', '.join(f['file'] for f in results.get('files', []))}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--phase",
        choices=("1", "2", "all"),
        default="all",
        help="all (or 1): every step; 2: what an earlier run left unfinished",
    )
    p.add_argument("--steps", help=f"comma list from {', '.join(ORDER)} (overrides --phase)")
    p.add_argument("--budget-s", type=float, default=3600.0, help="stop starting work after this many seconds")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu-kit"), help="where the results go")
    p.add_argument("--kit", default=str(REPO / ".gpu-kit"), help="the folder bench.gpu.prepare wrote")
    p.add_argument("--work", default="/tmp/bertserve-gpu-kit", help="kept between runs on the same machine")
    p.add_argument("--previous", help="results.json of an earlier run (default: --work's, then <kit>/previous.json)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: what tests/test_gpu_kit.py runs")
    args = p.parse_args(argv)
    return Kit(args).run()


if __name__ == "__main__":
    sys.exit(main())
