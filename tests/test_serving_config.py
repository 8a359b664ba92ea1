"""Per-task models (a torch checkpoint for /classify, an ONNX artifact for /qa) in one server, settings
from env vars, and Bearer auth."""

from __future__ import annotations

import httpx
import pytest
from test_serving_support import QA_ITEMS, Server, build_checkpoint, export_onnx


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    classify = build_checkpoint(root / "classify", task="classify")
    qa = export_onnx(build_checkpoint(root / "qa-ckpt", task="qa", seed=1), root / "qa-onnx", task="qa")
    srv = Server(
        "--classify-model",
        str(classify),
        "--qa-model",
        str(qa),
        # An export's and a fine-tuning's settings left in the environment are not the server's (each command
        # reads its own variables): the server starts with int8 and cuda in the environment.
        env={
            "BERTSERVE_API_KEY": "s3cret",
            "BERTSERVE_MAX_CLIENT_BATCH_SIZE": "3",
            "BERTSERVE_ONNX_PRECISION": "int8",
            "BERTSERVE_FINETUNE_DEVICE": "cuda",
        },
    )
    with srv:
        yield srv


def test_per_task_models_auth_and_env(server):
    auth = {"authorization": "Bearer s3cret"}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}):
            r = c.post("/classify", json={"inputs": "x"}, headers=headers)
            assert r.status_code == 401 and r.json()["error_type"] == "unauthorized"
        assert c.get("/info").status_code == 401
        assert c.get("/health").status_code == 200 and c.get("/ready").status_code == 200
        info = c.get("/info", headers=auth).json()
        assert info["tasks"] == ["classify", "qa"] and info["max_client_batch_size"] == 3
        assert info["backend"] == "torch,onnxruntime" and info["model"] == "classify,qa-onnx"
        assert info["labels"] == {"classify": ["negative", "positive"]}
        assert c.post("/classify", json={"inputs": ["a", "b"]}, headers=auth).status_code == 200
        assert c.post("/classify", json={"inputs": ["a"] * 4}, headers=auth).status_code == 413
        answer = c.post("/qa", json=QA_ITEMS[0], headers=auth).json()
        assert QA_ITEMS[0]["context"][answer["start"] : answer["end"]] == answer["answer"]
        r = c.post("/ner", json={"inputs": "x"}, headers=auth)
        assert r.status_code == 404 and r.json()["error_type"] == "not_found" and "classify, qa" in r.json()["error"]
