"""/embed and /v1/embeddings (issue 12, bars 1 and 2): all-MiniLM-L6-v2 served by bertserve gives the vectors
sentence-transformers gives, on every SST-2 dev sentence, batched and one by one, from the torch backend and
from an ONNX export; the official `openai` client reads the same vectors from /v1/embeddings."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from test_serving_support import PYTHON, REPO, Server, build_checkpoint

pytestmark = pytest.mark.minilm


@pytest.fixture(scope="module")
def sentences(sst2_dev) -> list[str]:
    return [s for s, _ in sst2_dev]


@pytest.fixture(scope="module")
def reference(minilm_dir, sentences) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    return model.encode(sentences, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)


@pytest.fixture(scope="module")
def onnx_artifact(minilm_dir, tmp_path_factory):
    import subprocess

    out = tmp_path_factory.mktemp("minilm-embed") / "artifact"
    run = subprocess.run(
        [PYTHON, "-m", "export.onnx", "--ckpt", str(minilm_dir), "--task", "embed", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out


KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def minilm_server(minilm_dir):
    """MiniLM on the torch backend, behind an API key (the `openai` client sends one): one server for the tests
    of this file that read its answers; the ONNX export and the multi-task checkpoint have their own."""
    with Server("--model", str(minilm_dir), "--api-key", KEY) as server:
        yield server


def _embed_all(url: str, sentences: list[str], batch: int) -> np.ndarray:
    vectors = []
    with httpx.Client(base_url=url, timeout=60, headers=AUTH) as client:
        for i in range(0, len(sentences), batch):
            body = {"inputs": sentences[i] if batch == 1 else sentences[i : i + batch]}
            response = client.post("/embed", json=body)
            assert response.status_code == 200, response.text
            vectors += response.json()
    return np.asarray(vectors)


SINGLY = 300  # sentences also sent alone, one request each


@pytest.mark.parametrize("backend,tolerance", [("torch", 1e-5), ("onnx", 1e-4)])
def test_embed_equals_sentence_transformers_on_sst2_dev(backend, tolerance, request, sentences, reference):
    if backend == "torch":
        server = request.getfixturevalue("minilm_server")
    else:
        server = Server("--model", str(request.getfixturevalue("onnx_artifact")), "--api-key", KEY)
        request.addfinalizer(server.stop)
        server.wait_ready()
    info = httpx.get(server.url + "/info", headers=AUTH).json()
    assert info["tasks"] == ["embed"]
    assert info["embedding"]["pooling"] == "mean" and info["embedding"]["dimensions"] == 384
    batched = _embed_all(server.url, sentences, 32)  # every sentence, in batches
    single = _embed_all(server.url, sentences[:SINGLY], 1)  # and the first ones again, one request each
    errors = {
        "batched": float(np.abs(batched - reference).max()),
        "single": float(np.abs(single - reference[:SINGLY]).max()),
    }
    print(f"bar 1, {backend}: {len(sentences)} SST-2 dev sentences, max |bertserve - sentence-transformers| {errors}")
    assert batched.shape == reference.shape and single.shape == reference[:SINGLY].shape
    assert errors["batched"] <= tolerance and errors["single"] <= tolerance, errors


def test_openai_client_reads_the_same_vectors(minilm_server, sentences, reference):
    openai = pytest.importorskip("openai")
    texts = sentences[:32]  # the default max_client_batch_size
    server = minilm_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    default = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)  # base64 on the wire
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    one = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[0])
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[0], dimensions=385)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).embeddings.create(
            model="m", input="x"
        )
    for result in (default, floats):
        vectors = np.asarray([d.embedding for d in sorted(result.data, key=lambda d: d.index)])
        assert np.abs(vectors - reference[:32]).max() <= 1e-5
        assert result.model == "all-MiniLM-L6-v2" and result.usage.prompt_tokens > 32 * 3
    assert np.abs(np.asarray(one.data[0].embedding) - reference[0]).max() <= 1e-5


def test_v1_embeddings_wire_format(minilm_server, reference, sentences):
    with httpx.Client(base_url=minilm_server.url, headers=AUTH, timeout=60) as client:
        raw = client.post("/v1/embeddings", json={"input": sentences[:2], "model": "m", "encoding_format": "base64"})
        raw = raw.json()
        assert raw["object"] == "list" and [d["index"] for d in raw["data"]] == [0, 1]
        decoded = np.frombuffer(base64.b64decode(raw["data"][1]["embedding"]), dtype="<f4")
        assert np.abs(decoded - reference[1]).max() <= 1e-5
        assert raw["usage"]["prompt_tokens"] == raw["usage"]["total_tokens"] > 0
        for body, status in [
            ({"input": [1, 2, 3]}, 422),
            ({"input": ""}, 400),
            ({"input": []}, 400),
            ({"input": ["x"] * 33}, 413),
            ({"input": "x", "encoding_format": "hex"}, 422),
            ({"input": "x", "extra": 1}, 422),
        ]:
            response = client.post("/v1/embeddings", json=body)
            assert response.status_code == status, (body, response.text)
            assert set(response.json()) == {"error", "error_type"}
        unnormalised = client.post("/embed", json={"inputs": "a film", "normalize": False}).json()[0]
        assert abs(np.linalg.norm(unnormalised) - 1) > 1e-3  # raw pooled vector: not unit length


def test_multitask_checkpoint_serves_embed_beside_its_heads(tmp_path):
    """One forward pass: a tiny multi-task checkpoint answers /embed as well as its three heads, and a mixed
    load of both gives each the answer it gets alone."""
    import asyncio

    checkpoint = build_checkpoint(tmp_path / "multi")
    with Server("--model", str(checkpoint)) as server:
        assert httpx.get(server.url + "/info").json()["tasks"] == ["classify", "ner", "qa", "embed"]
        texts = ["a short one", "a much longer sentence about nothing much at all", "ok"]
        alone = httpx.post(server.url + "/embed", json={"inputs": texts}).json()
        labels_alone = httpx.post(server.url + "/classify", json={"inputs": texts}).json()

        async def mixed():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
                jobs = [c.post("/embed", json={"inputs": t}) for t in texts] + [
                    c.post("/classify", json={"inputs": t}) for t in texts
                ]
                return [r.json() for r in await asyncio.gather(*jobs)]

        answers = asyncio.run(mixed())
    assert np.abs(np.asarray([a[0] for a in answers[:3]]) - np.asarray(alone)).max() < 1e-5
    assert [a[0]["label"] for a in answers[3:]] == [x[0]["label"] for x in labels_alone]
