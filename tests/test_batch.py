"""python -m batch as a job: Parquet parts in input order with typed columns and a manifest; a job killed with
SIGKILL at three moments and rerun writes the same bytes as an uninterrupted one; bad rows get their error and
never stop the job; what makes a job impossible is one line and exit 2, before any work; the Predictor takes a
dict, an Arrow table or a pandas frame."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from batch import Predictor  # noqa: E402
from batch.__main__ import main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEXTS = [
    "I loved this film.",
    "A long, slow and ultimately pointless exercise in style over substance.",
    "Terrible.",
    "My name is Wolfgang and I live in Berlin with my friend Sarah from London.",
    "ok",
    "The plot is gripping and the photography in the second half is simply beautiful.",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from test_serving_support import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("batch") / "multi")


def _rows(n: int) -> list[dict]:
    return [{"id": i, "text": f"{TEXTS[i % len(TEXTS)]} {'word ' * (i % 13)}row {i}"} for i in range(n)]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(capsys, *argv) -> tuple[int, list[str]]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _digests(output: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(output.glob("part-*.parquet"))}


def test_parts_keep_input_order_typed_columns_and_the_manifest(tiny, tmp_path, capsys):
    source = tmp_path / "in.parquet"
    rows = _rows(45)
    pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}), source)
    out = tmp_path / "out"
    code, lines = _run(
        capsys,
        "--task",
        "ner",
        "--model",
        tiny,
        "--input",
        source,
        "--output",
        out,
        "--keep",
        "id",
        "--part-rows",
        20,
        "--window-rows",
        8,
    )
    assert code == 0, lines
    manifest = json.loads((out / "_manifest.json").read_text())
    assert [p["rows"] for p in manifest["parts"]] == [[0, 20], [20, 40], [40, 45]] and manifest["complete"]
    for part in manifest["parts"]:
        assert hashlib.sha256((out / part["file"]).read_bytes()).hexdigest() == part["sha256"]
    table = pq.read_table(out)
    assert table["id"].to_pylist() == list(range(45))
    assert table.schema.field("entities").type == pa.list_(
        pa.struct(
            [
                ("start", pa.int32()),
                ("end", pa.int32()),
                ("word", pa.string()),
                ("entity_group", pa.string()),
                ("score", pa.float32()),
            ]
        )
    )
    assert table["error"].null_count == 45
    # The same rows through the API, in one call (other batches: scores differ in the last float bits), answer
    # the same.
    direct = Predictor("ner", tiny)({"text": [r["text"] for r in rows]})["entities"].to_pylist()
    for ours, job in zip(direct, table["entities"].to_pylist(), strict=True):
        assert [dict(e, score=0) for e in ours] == [dict(e, score=0) for e in job]
        assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(ours, job))

    embed_out = tmp_path / "embed"
    code, lines = _run(capsys, "--task", "embed", "--model", tiny, "--input", source, "--output", embed_out)
    assert code == 0, lines
    assert pq.read_table(embed_out).schema.field("embedding").type == pa.list_(pa.float32(), 32)


def test_sigkill_at_three_moments_then_rerun_gives_identical_parts(tiny, tmp_path, capsys):
    source = _jsonl(tmp_path / "in.jsonl", _rows(60))
    common = [
        "-m",
        "batch",
        "--task",
        "classify",
        "--model",
        str(tiny),
        "--input",
        str(source),
        "--keep",
        "id",
        "--part-rows",
        "20",
        "--window-rows",
        "8",
        "--workers",
        "1",
        "--threads",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("BERTSERVE_PAUSE_AT", None)
    whole = tmp_path / "whole"
    code, lines = _run(capsys, *common[2:], "--output", whole)  # uninterrupted, in this process
    assert code == 0, lines
    expected = _digests(whole)
    assert len(expected) == 3

    killed = tmp_path / "killed"
    # mid-part (a window of the second part computed), a part written aside but not renamed (half of it on
    # disk), a part renamed but not yet in the manifest
    for moment in ("batch:window-28", "batch:part-00001.parquet:aside", "batch:part-00002.parquet:renamed"):
        process = subprocess.Popen(
            [sys.executable, *common, "--output", str(killed)],
            env={**env, "BERTSERVE_PAUSE_AT": moment},
            stderr=subprocess.PIPE,
            text=True,
        )
        paused = False
        for line in process.stderr:
            if f"paused at {moment}" in line:
                paused = True
                break
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert paused and process.returncode == -signal.SIGKILL, moment
    rerun = subprocess.run([sys.executable, *common, "--output", str(killed)], env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert "continuing after row" in rerun.stderr
    assert _digests(killed) == expected
    assert not list(killed.glob(".part-*"))
    manifest = json.loads((killed / "_manifest.json").read_text())
    assert manifest["complete"] and [p["sha256"] for p in manifest["parts"]] == list(expected.values())


def test_bad_rows_get_their_error_and_the_job_completes(tiny, tmp_path, capsys):
    good = _rows(4)
    lines = [json.dumps(r).encode() for r in good[:2]]
    bad = {
        "null": {"id": 100, "text": None},
        "empty": {"id": 101, "text": ""},
        "not a string (int)": {"id": 102, "text": 5},
        "has more than 512 tokens": {"id": 103, "text": "word " * 20_000},
    }
    lines += [json.dumps(r).encode() for r in bad.values()]
    lines.append(b'{"id": 104, "text": "caf\xe9 au lait"}')  # Latin-1, not UTF-8
    lines.append(b'{"id": 105, "text": ')  # not JSON
    lines += [json.dumps(r).encode() for r in good[2:]]
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out"
    code, err = _run(capsys, "--task", "classify", "--model", tiny, "--input", source, "--output", out, "--keep", "id")
    assert code == 0, err
    assert "6 errors" in err[-1]
    table = pq.read_table(out).to_pylist()
    errors = {r["id"]: r["error"] for r in table}
    assert [r["id"] for r in table] == [0, 1, 100, 101, 102, 103, 104, None, 2, 3]  # a line that is no JSON has no id
    for reason, row in bad.items():
        assert errors[row["id"]].startswith(reason), errors
    assert errors[104] == "invalid UTF-8" and errors[None].startswith("line 8 is not JSON")
    assert all(
        errors[i] is None and r["label"] is not None
        for i, r in zip((0, 1, 2, 3), [table[0], table[1], table[8], table[9]])
    )
    assert all(r["label"] is None for r in table if r["error"])

    cut = tmp_path / "cut"
    code, err = _run(
        capsys, "--task", "classify", "--model", tiny, "--input", source, "--output", cut, "--keep", "id", "--truncate"
    )
    assert code == 0 and "5 errors" in err[-1], err
    long_row = next(r for r in pq.read_table(cut).to_pylist() if r["id"] == 103)
    assert long_row["error"] is None and long_row["label"] is not None


def test_what_makes_a_job_impossible_is_one_line_and_exit_2(tiny, tmp_path, capsys):
    source = _jsonl(tmp_path / "in.jsonl", _rows(5))
    out = tmp_path / "out"
    base = ["--model", tiny, "--output", out]
    garbage = tmp_path / "broken.parquet"
    garbage.write_bytes(b"not a parquet file at all")
    cases = [
        (["--task", "classify", "--input", source, "--column", "body"], "no column 'body'"),
        (["--task", "classify", "--input", garbage], "cannot be read as parquet"),
        (["--task", "classify", "--input", tmp_path / "nowhere.csv"], "no such file"),
        (["--task", "rerank", "--input", source, "--column", "text,text"], "serves only classify, ner, qa, embed"),
        (["--task", "zero_shot", "--input", source], "--candidate-labels is required"),
        (["--task", "qa", "--input", source, "--column", "text"], "qa reads 2 column(s)"),
    ]
    for argv, message in cases:
        code, lines = _run(capsys, *argv, *base)
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (argv, lines)
        assert not out.exists()  # refused before any work
    code, lines = _run(capsys, "--task", "classify", "--input", source, *base)
    assert code == 0, lines
    code, lines = _run(capsys, "--task", "classify", "--input", source, "--truncate", *base)
    assert code == 2 and len(lines) == 1 and "--truncate False (now True)" in lines[0], lines
    code, lines = _run(capsys, "--task", "ner", "--input", source, *base)
    assert code == 2 and "task classify (now ner)" in lines[0], lines
    code, lines = _run(capsys, "--task", "ner", "--input", source, "--overwrite", *base)
    assert code == 0 and "entities" in pq.read_table(out).column_names, lines


def test_the_predictor_takes_dicts_arrow_and_pandas(tiny):
    predictor = Predictor("classify", tiny, keep=["id"])
    as_dict = predictor({"id": [1, 2], "text": TEXTS[:2]})
    as_arrow = predictor(pa.table({"id": [1, 2], "text": TEXTS[:2], "other": ["x", "y"]}))
    assert as_dict.column_names == ["id", "label", "score", "error"] and as_dict.equals(as_arrow)
    pairs = Predictor("classify", tiny, column="a,b")({"a": TEXTS[:2], "b": TEXTS[2:4]})
    assert pairs.column_names == ["a", "b", "label", "score", "error"] and pairs["error"].null_count == 2
    pd = pytest.importorskip("pandas")
    frame = predictor(pd.DataFrame({"id": [1, 2], "text": TEXTS[:2]}))
    assert isinstance(frame, pd.DataFrame) and list(frame["label"]) == as_dict["label"].to_pylist()


def test_worker_processes_write_the_same_parts(tiny, tmp_path, capsys):
    source = _jsonl(tmp_path / "in.jsonl", _rows(40))
    common = ["--task", "classify", "--model", str(tiny), "--input", str(source), "--keep", "id"]
    # batches of 2: the job's last 2 windows (rows 32-39) are split, a batch to each worker, and joined here
    common += ["--part-rows", "16", "--window-rows", "4", "--threads", "1", "--max-batch-size", "2"]
    code, lines = _run(capsys, *common, "--workers", "1", "--output", tmp_path / "one")
    assert code == 0, lines
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "batch", *common, "--workers", "2", "--output", str(tmp_path / "two")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert len(_digests(tmp_path / "one")) == 3 and _digests(tmp_path / "one") == _digests(tmp_path / "two")


@pytest.mark.parametrize("task", ["classify", "qa"])
def test_a_window_split_into_shares_answers_what_one_process_answers(tiny, task):
    """The end of a job splits its last windows' batches among the workers (predict_share) and joins them
    (join_shares): the same answers, errors and counts as predict on the whole window, for rows that are one
    sequence each and for QA rows whose long contexts run as several windows in different batches."""
    predictor = Predictor(task, tiny, max_batch_size=3, truncate=False)
    context = " ".join(f"{t} The sentence number {i} is here." for i, t in enumerate(TEXTS * 12))
    if task == "qa":
        columns = {
            "question": ["Who lives in Berlin?", None, "What is beautiful?", "Where?", "", "Which plot?", "Why?"],
            "context": [context, TEXTS[0], context[: len(context) // 2], TEXTS[3], TEXTS[4], context, TEXTS[5]],
        }
    else:
        columns = {"text": [*[f"{t} {'word ' * i}" for i, t in enumerate(TEXTS * 3)], None, ""]}
    whole = predictor.predict(columns)
    assert whole.sequences > (len(columns["context"]) if task == "qa" else 0)
    for shares in (2, 3):
        parts = [predictor.predict_share(columns, None, k, shares) for k in range(shares)]
        assert all(any(o is None for item in outputs for o in item) for outputs, _, _ in parts)  # each ran a part
        joined = predictor.join_shares(columns, None, parts)
        assert joined.table.equals(whole.table), shares
        assert (joined.tokens, joined.sequences, joined.padded, joined.errors) == (
            whole.tokens,
            whole.sequences,
            whole.padded,
            whole.errors,
        )
    assert whole.errors == 2


def _tiny_transformers_model(directory: Path, kind: str) -> Path:
    import torch
    import transformers
    from test_serving_support import minilm_dir

    common = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    if kind == "fill_mask":
        model = transformers.BertForMaskedLM(transformers.BertConfig(**common))
    elif kind == "rerank":
        model = transformers.BertForSequenceClassification(transformers.BertConfig(**common, num_labels=1))
    else:
        labels = {0: "entailment", 1: "neutral", 2: "contradiction"}
        config = transformers.BertConfig(**common, id2label=labels, label2id={v: k for k, v in labels.items()})
        model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4)  # random weights that tell inputs apart
    model.eval().save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir())).save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    "task, options, columns, types",
    [
        ("rerank", {}, {"query": ["who lives in berlin?"] * 4, "document": TEXTS[:4]}, {"score": pa.float32()}),
        (
            "zero_shot",
            {"column": "premise", "candidate_labels": "cinema,travel,food"},
            {"premise": TEXTS[:4]},
            {"labels": pa.list_(pa.string()), "scores": pa.list_(pa.float32())},
        ),
        (
            "fill_mask",
            {"top_k": 3},
            {"text": ["I [MASK] this film.", "Paris is the [MASK] of [MASK].", "no mask here", "[MASK]"]},
            {
                "masks": pa.list_(
                    pa.list_(
                        pa.struct(
                            [
                                ("token", pa.int64()),
                                ("token_str", pa.string()),
                                ("score", pa.float32()),
                                ("sequence", pa.string()),
                            ]
                        )
                    )
                )
            },
        ),
    ],
)
def test_every_other_task_answers_a_batch_as_each_row_alone(task, options, columns, types, tmp_path):
    model = _tiny_transformers_model(tmp_path / task, task)
    predictor = Predictor(task, model, **options)
    batched = predictor(columns)
    for name, kind in types.items():
        assert batched.schema.field(name).type == kind, name
    rows = len(next(iter(columns.values())))
    for row in range(rows):
        alone = predictor({k: v[row : row + 1] for k, v in columns.items()}).to_pylist()[0]
        together = batched.to_pylist()[row]
        assert together["error"] == alone["error"]
        _assert_close(together, alone)
    if task == "fill_mask":  # the text without a mask is the codec's refusal, that row's only
        assert [e is None for e in batched["error"].to_pylist()] == [True, True, False, True]
        assert len(batched["masks"].to_pylist()[1]) == 2 and len(batched["masks"].to_pylist()[1][0]) == 3
    else:
        assert batched["error"].null_count == rows


def _assert_close(a, b, where="row"):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert abs(a - b) < 1e-5, where
    else:
        assert a == b, where


def test_two_batches_at_once_answer_as_one_at_a_time(tiny):
    """Two threads are two single-threaded runs of the window's batches at once: each row's answer is the one
    it gets from batches run one after another, in its own place."""
    rows = _rows(30) + [{"id": 30, "text": ""}]
    columns = {"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}
    one = Predictor("classify", tiny, keep=["id"], threads=1, max_batch_size=2)
    two = Predictor("classify", tiny, keep=["id"], threads=2, max_batch_size=2)
    assert (one.runs, two.runs) == (1, 2)
    alone, together = one(columns), two(columns)
    assert together["id"].to_pylist() == columns["id"]
    assert together["label"].to_pylist() == alone["label"].to_pylist()
    assert together["error"].to_pylist() == alone["error"].to_pylist() and together["error"].null_count == 30
    for a, b in zip(together["score"].to_pylist(), alone["score"].to_pylist()):
        assert (a is None and b is None) or abs(a - b) < 1e-5


def test_a_batch_holds_32_sequences_on_torch_and_8_on_onnxruntime_unless_told(tiny, tmp_path):
    """torch pays its per-operator cost once a batch, onnxruntime about the same per sequence at any size: the
    default differs by backend; --max-batch-size wins over it."""
    from test_serving_support import export_onnx

    from batch.predict import default_batch_size

    assert Predictor("classify", tiny, threads=1).batches.max_batch_size == 32
    assert Predictor("classify", tiny, threads=1, max_batch_size=5).batches.max_batch_size == 5
    onnx = export_onnx(tiny, tmp_path / "onnx")
    assert Predictor("classify", onnx, threads=1).batches.max_batch_size == 8
    assert default_batch_size("cuda", "torch") == default_batch_size("cuda", "onnxruntime") == 64


def test_precision_auto_is_bf16_for_an_embed_job_on_a_checkpoint_on_a_cpu_with_bf16_units(tmp_path):
    """The rule, given the CPU's flags: bf16 only where all of it holds (embed, checkpoint, torch, cpu, AMX-BF16 or
    AVX512-BF16); otherwise the backend's own default (None); an explicit precision wins either way."""
    from batch.precision import Choice, choose_precision
    from bert.precision import bf16_units, cpu_flags

    amx = frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    dot_products = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"})  # AVX512-BF16 alone (no tiles)
    without = frozenset({"avx2", "avx512f", "avx512_vnni"})
    job = {"task": "embed", "device": "cpu", "kind": "checkpoint", "backend": "auto"}
    assert choose_precision("auto", **job, flags=amx) == Choice("bf16", "auto: bf16 matmuls (amx_bf16)")
    assert choose_precision("auto", **{**job, "backend": "torch"}, flags=amx).precision == "bf16"
    assert choose_precision("auto", **job, flags=dot_products) == Choice("bf16", "auto: bf16 matmuls (avx512_bf16)")
    assert choose_precision("auto", **job, flags=without).precision is None
    assert bf16_units(amx) == ["amx_bf16", "avx512_bf16"] and bf16_units(without) == []
    for other in ({"task": "classify"}, {"kind": "onnx"}, {"kind": "artifact"}, {"device": "cuda"}):
        assert choose_precision("auto", **{**job, **other}, flags=amx).precision is None, other
    assert choose_precision("fp32", **job, flags=amx).precision == "fp32"
    assert choose_precision("bf16", **job, flags=without).precision == "bf16"
    assert choose_precision(None, **job, flags=amx).precision is None

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n\nprocessor\t: 1\n")
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "avx512f", "amx_bf16", "amx_tile"})
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_a_bf16_embed_job_stays_within_cosine_099_of_fp32_and_auto_says_what_it_chose(tiny, tmp_path, capsys):
    import numpy as np

    from bert.precision import bf16_units, cpu_flags

    source = _jsonl(tmp_path / "in.jsonl", _rows(40))
    vectors, manifests = {}, {}
    for precision in ("fp32", "bf16", "auto"):
        out = tmp_path / precision
        code, lines = _run(
            capsys, "--task", "embed", "--model", tiny, "--input", source, "--output", out, "--precision", precision
        )
        assert code == 0, lines
        manifests[precision] = json.loads((out / "_manifest.json").read_text())["model"]
        assert f"torch {manifests[precision]['precision']} (" in lines[-1], lines[-1]
        vectors[precision] = np.asarray(pq.read_table(out)["embedding"].to_pylist(), dtype=np.float64)
    assert manifests["fp32"]["precision"] == "fp32" and manifests["bf16"]["precision"] == "bf16"
    cosine = (vectors["bf16"] * vectors["fp32"]).sum(1)  # normalized rows
    assert not np.array_equal(vectors["bf16"], vectors["fp32"])  # bf16 ran
    assert cosine.min() >= 0.99, cosine.min()
    chosen = "bf16" if bf16_units(cpu_flags()) else "fp32"
    assert manifests["auto"]["precision"] == chosen and manifests["auto"]["precision_choice"].startswith("auto: ")
    assert np.array_equal(vectors["auto"], vectors[chosen])


def test_a_ray_cluster_that_wants_its_token_is_refused_in_one_line_that_says_how():
    from batch.ray_job import _auth_hint

    try:
        try:
            raise RuntimeError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect")
        except RuntimeError as e:
            raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6379") from e
    except ConnectionError as e:
        assert "RAY_AUTH_MODE=token" in _auth_hint(e)
    assert _auth_hint(ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6379")) == ""


def test_a_ray_job_cuts_blocks_that_end_on_every_actor_together():
    from batch.ray_job import _blocks

    assert _blocks(50_000, 2048, 2) == 26  # 25 windows would leave one actor a block alone at the end
    assert _blocks(40_960, 2048, 2) == 20 and _blocks(40_960, 2048, 3) == 21
    assert _blocks(60, 8, 2) == 8
    assert _blocks(3, 2048, 2) == 2 and _blocks(1, 2048, 4) == 1  # never more blocks than rows


def test_a_ray_without_the_file_reading_hooks_the_jsonl_reader_extends_is_refused_in_one_line():
    """The JSONL reader extends two hooks of Ray Data that are not its stable API: a Ray without them is refused
    before any read, naming what is missing and the way round (the installed Ray's pass: tests/test_batch_ray.py)."""
    from batch.predict import JobError
    from batch.ray_job import check_reader_api

    class FileBasedDatasource:
        def _read_stream(self, f, path):
            yield from ()

    class DefaultFileMetadataProvider:
        pass

    with pytest.raises(JobError, match=r"^--ray: .*DefaultFileMetadataProvider\._get_block_metadata, which ray 9\.0 "):
        check_reader_api(FileBasedDatasource, DefaultFileMetadataProvider, "9.0")
    DefaultFileMetadataProvider._get_block_metadata = lambda self, paths, **kwargs: None
    check_reader_api(FileBasedDatasource, DefaultFileMetadataProvider, "9.0")


def test_a_ray_job_gives_its_actors_an_environment_only_where_they_need_one(tmp_path, monkeypatch):
    """Ray puts the driver's directory on its workers' path; an actor given an environment of its own starts
    through a second Python, so the job passes bertserve's PYTHONPATH only when the workers would lack it."""
    from batch.ray_job import _actor_env

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{root}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(root)
    assert _actor_env() == {}  # run from the checkout: Ray hands its directory over
    monkeypatch.chdir(tmp_path)
    assert _actor_env() == {"PYTHONPATH": f"{tmp_path}{os.pathsep}{root}", "OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert _actor_env() == {}  # bertserve comes from elsewhere (installed): nothing to give


def _refused(capsys, out: Path, *argv) -> str:
    """The job's one `error:` line, asserting exit 2 and nothing written."""
    existed = out.exists()
    code, lines = _run(capsys, *argv, "--output", out)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, code, lines)
    assert out.exists() == existed  # refused before any work
    return lines[0]


def test_undecodable_bytes_in_a_kept_column_become_u_fffd_and_never_stop_the_job(tiny, tmp_path, capsys):
    csv_file = tmp_path / "bad.csv"
    csv_file.write_bytes(b"id,text\n\xff1,good movie\n2,bad film\n3,caf\xe9\n")
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_bytes(
        b'{"id": "\xff1", "n": {"k": "a\xfeb"}, "text": "good movie"}\n{"id": "2", "n": null, "text": "x"}\n'
    )
    for source, keep in ((csv_file, "id,text"), (jsonl, "id,n")):
        out = tmp_path / source.suffix[1:]
        code, lines = _run(
            capsys, "--task", "classify", "--model", tiny, "--input", source, "--output", out, "--keep", keep
        )
        assert code == 0 and "errors" in lines[-1], lines
        rows = pq.read_table(out).to_pylist()
        assert rows[0]["id"] == "\ufffd1" and rows[1]["id"] == "2" and rows[0]["error"] is None
        if source == csv_file:  # the text column itself: that row's error, its kept copy readable
            assert rows[2]["error"] == "invalid UTF-8" and rows[2]["text"] == "caf\ufffd"
        else:
            assert rows[0]["n"] == {"k": "a\ufffdb"} and rows[1]["n"] is None


def test_a_rerun_on_an_input_changed_in_place_is_refused_even_at_the_same_size(tiny, tmp_path, capsys):
    source = _jsonl(tmp_path / "in.jsonl", _rows(6))
    out = tmp_path / "out"
    argv = ["--task", "classify", "--model", tiny, "--input", source]
    code, lines = _run(capsys, *argv, "--output", out)
    assert code == 0, lines
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["input"]["files"][0]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    size = source.stat().st_size
    source.write_bytes(source.read_bytes().replace(b"loved", b"hated"))
    assert source.stat().st_size == size
    line = _refused(capsys, out, *argv)
    assert f"{source} as it was then" in line and "--overwrite" in line, line
    code, lines = _run(capsys, *argv, "--output", out, "--overwrite")
    assert code == 0, lines
    # a manifest of the version that recorded only sizes: its input cannot be checked, so it is refused
    manifest = json.loads((out / "_manifest.json").read_text())
    del manifest["input"]["files"][0]["sha256"]
    (out / "_manifest.json").write_text(json.dumps(manifest))
    assert "no sha256 for" in _refused(capsys, out, *argv)


def test_kept_columns_that_clash_are_refused_and_lists_lose_their_spaces(tiny, tmp_path, capsys):
    from batch.predict import JobError

    source = _jsonl(tmp_path / "in.jsonl", [{"id": i, "label": "x", "error": "y", **r} for i, r in enumerate(_rows(4))])
    out = tmp_path / "out"
    argv = ["--task", "classify", "--model", tiny, "--input", source]
    assert "a result column's name" in _refused(capsys, out, *argv, "--keep", "id,label")
    assert "'error'" in _refused(capsys, out, *argv, "--keep", "error")
    assert "'id' more than once" in _refused(capsys, out, *argv, "--keep", "id, id")
    with pytest.raises(JobError, match="result column"):
        Predictor("classify", tiny, keep="label")
    code, lines = _run(capsys, *argv, "--output", out, "--keep", " id , text", "--column", " text ")
    assert code == 0, lines
    assert pq.read_table(out).column_names == ["id", "text", "label", "score", "error"]
    qa = _jsonl(tmp_path / "qa.jsonl", [{"question": "Who?", "context": TEXTS[3]}])
    code, lines = _run(
        capsys,
        "--task",
        "qa",
        "--model",
        tiny,
        "--input",
        qa,
        "--column",
        "question, context",
        "--output",
        tmp_path / "qa",
    )
    assert code == 0, lines


@pytest.mark.parametrize(
    "option, value",
    [
        ("--max-batch-size", -1),
        ("--max-batch-size", 0),
        ("--workers", -1),
        ("--threads", -2),
        ("--max-input-length", -5),
        ("--max-batch-tokens", 0),
        ("--window-rows", 0),
        ("--part-rows", -3),
        ("--max-padding", 1.5),
        ("--top-k", 0),
    ],
)
def test_a_numeric_option_out_of_range_is_one_line_before_any_work(tiny, tmp_path, capsys, option, value):
    source = _jsonl(tmp_path / "in.jsonl", _rows(2))
    line = _refused(capsys, tmp_path / "out", "--task", "classify", "--model", tiny, "--input", source, option, value)
    assert line.startswith(f"error: argument {option}: must be at ") and str(value) in line, line


def test_an_output_that_is_no_jobs_directory_is_refused_and_left_alone(tiny, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    _jsonl(data / "a.jsonl", _rows(3))
    argv = ["--task", "classify", "--model", tiny, "--input", data]
    other = tmp_path / "other"
    other.mkdir()
    (other / "part-00000.parquet").write_bytes(b"someone else's")
    for extra in ([], ["--overwrite"]):
        assert "no _manifest.json" in _refused(capsys, other, *argv, *extra)
    assert (other / "part-00000.parquet").read_bytes() == b"someone else's"
    assert "is inside --input" in _refused(capsys, data / "out", *argv)
    assert "no _manifest.json" in _refused(capsys, data, *argv)  # the input directory itself: it holds files
    assert "a file, not a directory" in _refused(capsys, data / "a.jsonl" / "out", *argv)
    assert "is a file" in _refused(capsys, data / "a.jsonl", *argv)
    pattern = str(tmp_path / "d*" / "*.parquet")  # parts written to dout/ would be read by a rerun
    pq.write_table(pa.table({"text": TEXTS}), data / "t.parquet")
    assert "is inside --input" in _refused(
        capsys, tmp_path / "dout", "--task", "classify", "--model", tiny, "--input", pattern
    )
    assert "is inside --input" in _refused(
        capsys, data / "out", "--task", "classify", "--model", tiny, "--input", str(data / "**" / "*.parquet")
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    code, lines = _run(capsys, *argv, "--output", empty)
    assert code == 0, lines
    code, lines = _run(
        capsys, "--task", "classify", "--model", tiny, "--input", str(data / "*.parquet"), "--output", tmp_path / "x"
    )
    assert code == 0, lines


def test_the_ray_jobs_staging_directory_is_the_one_the_local_job_knows():
    from batch.job import RAY_STAGING
    from batch.ray_job import RAY_TMP

    assert RAY_STAGING == RAY_TMP


def test_ctrl_c_is_one_line_exit_130_and_the_same_command_resumes(tiny, tmp_path):
    source = _jsonl(tmp_path / "in.jsonl", _rows(40))
    command = [sys.executable, "-m", "batch", "--task", "classify", "--model", str(tiny), "--input", str(source)]
    command += ["--output", str(tmp_path / "out"), "--part-rows", "16", "--window-rows", "4", "--workers", "2"]
    command += ["--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "BERTSERVE_PAUSE_AT": "batch:window-20"}
    # its own process group, as a terminal's Ctrl-C reaches the job and its workers; with SIGINT's default action, as
    # from a terminal (a shell starts a background command with SIGINT ignored, and a child inherits that: a test
    # suite run as `cmd &` would otherwise see the job, rightly, ignore the Ctrl-C)
    process = subprocess.Popen(
        command,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    for line in process.stderr:
        if "paused at" in line:
            break
    os.killpg(process.pid, signal.SIGINT)
    rest = process.stderr.read()
    assert process.wait(60) == 130, rest
    lines = [line for line in rest.splitlines() if line.strip() and "rows/s" not in line]
    assert lines == ["interrupted; run the same command again to resume"], rest
    env.pop("BERTSERVE_PAUSE_AT")
    rerun = subprocess.run(command, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0 and "done: 40 rows" in rerun.stderr, rerun.stderr
    assert pq.read_table(tmp_path / "out")["error"].null_count == 40


def test_a_precision_an_onnx_export_does_not_have_is_refused(tiny, tmp_path, capsys):
    from test_serving_support import export_onnx

    onnx = export_onnx(tiny, tmp_path / "onnx")
    source = _jsonl(tmp_path / "in.jsonl", _rows(2))
    argv = ["--task", "classify", "--model", onnx, "--input", source]
    line = _refused(capsys, tmp_path / "out", *argv, "--precision", "bf16")
    assert "onnx export in fp32" in line, line
    code, lines = _run(capsys, *argv, "--precision", "fp32", "--output", tmp_path / "out")
    assert code == 0, lines


def test_a_kept_column_has_one_type_in_every_part_so_the_parts_read_as_one_table(tiny, tmp_path, capsys):
    rows = _rows(12)
    mixed = _jsonl(  # ids ints in the first part, strings in the second; nulls first, then ints
        tmp_path / "mixed.jsonl",
        [{"id": i if i < 6 else f"s{i}", "n": None if i < 6 else i, "text": r["text"]} for i, r in enumerate(rows)],
    )
    parquet = tmp_path / "pq"
    parquet.mkdir()
    pq.write_table(pa.table({"id": pa.array([0, 1], pa.int32()), "text": TEXTS[:2]}), parquet / "a.parquet")
    pq.write_table(pa.table({"id": ["x", "y"], "text": TEXTS[2:4]}), parquet / "b.parquet")
    pq.write_table(pa.table({"id": pa.array([5, 6], pa.int64()), "text": TEXTS[4:6]}), parquet / "c.parquet")
    small = ["--part-rows", 2, "--window-rows", 2]
    for source, ids in ((mixed, [*map(str, range(6)), *(f"s{i}" for i in range(6, 12))]), (parquet, None)):
        out = tmp_path / f"out-{source.name}"
        keep = "id,n" if ids else "id"
        argv = ["--task", "classify", "--model", tiny, "--input", source, "--output", out, "--keep", keep, *small]
        code, lines = _run(capsys, *argv)
        assert code == 0, lines
        table = pq.read_table(out)  # every part: one schema
        assert table.schema.field("id").type == pa.string()
        if ids:
            assert table["id"].to_pylist() == ids
            assert table.schema.field("n").type == pa.int64() and table["n"].to_pylist() == [None] * 6 + [*range(6, 12)]
        else:
            assert table["id"].to_pylist() == ["0", "1", "x", "y", "5", "6"]
    from batch.inputs import common_type

    assert common_type([pa.int32(), pa.int64(), pa.null()]) == pa.int64()
    assert common_type([pa.int64(), pa.float64()]) == pa.float64() and common_type([pa.null()]) == pa.null()


def test_an_integer_a_float_would_round_keeps_its_digits_beside_floats(tiny, tmp_path, capsys):
    """A kept id of 2**53+1 in one window and a float in another: float64 would round the id (and the cast of
    its window failed the job with a traceback); the column is text, every value as written."""
    rows = [{"id": 2**53 + 1, "text": TEXTS[0]}, {"id": 2.5, "text": TEXTS[1]}, {"id": 7, "text": TEXTS[2]}]
    source = _jsonl(tmp_path / "ids.jsonl", rows)
    out = tmp_path / "out"
    argv = ["--task", "classify", "--model", tiny, "--input", source, "--output", out, "--keep", "id"]
    code, lines = _run(capsys, *argv, "--window-rows", 1, "--part-rows", 1)
    assert code == 0, lines
    assert pq.read_table(out)["id"].to_pylist() == ["9007199254740993", "2.5", "7"]
    # an integer float64 holds, beside floats, is a float as before
    source = _jsonl(tmp_path / "small.jsonl", [{**rows[0], "id": 2**53}, *rows[1:]])
    argv = ["--task", "classify", "--model", tiny, "--input", source, "--output", tmp_path / "out2", "--keep", "id"]
    code, lines = _run(capsys, *argv, "--window-rows", 1)
    assert code == 0, lines
    assert pq.read_table(tmp_path / "out2")["id"].to_pylist() == [float(2**53), 2.5, 7.0]


def _empty_files(directory: Path) -> list[str]:
    """Inputs without a row: 0 bytes (JSONL, CSV, TSV) and a JSONL file of blank lines."""
    directory.mkdir(exist_ok=True)
    for name in ("b-empty.jsonl", "d-empty.csv", "e-empty.tsv"):
        (directory / name).write_bytes(b"")
    (directory / "c-blank.jsonl").write_bytes(b"\n  \n\r\n")
    return ["b-empty.jsonl", "c-blank.jsonl", "d-empty.csv", "e-empty.tsv"]


def test_an_empty_input_file_is_a_file_of_no_rows_and_the_job_goes_on_and_resumes(tiny, tmp_path, capsys):
    data = tmp_path / "data"
    empty = _empty_files(data)
    _jsonl(data / "a.jsonl", _rows(5))
    _jsonl(data / "f.jsonl", _rows(12)[5:])
    argv = ["--task", "classify", "--model", tiny, "--keep", "id", "--part-rows", 4, "--window-rows", 2]
    for spec, out in ((data, tmp_path / "dir"), (str(data / "*"), tmp_path / "glob")):
        code, lines = _run(capsys, *argv, "--input", spec, "--output", out)
        assert code == 0 and lines[-1].startswith("done: 12 rows in 3 parts"), lines
        table = pq.read_table(out)
        assert table["id"].to_pylist() == list(range(12)) and table["error"].null_count == 12
        assert table.schema.field("id").type == pa.int64()  # an empty CSV lends a kept column no type (text)
        manifest = json.loads((out / "_manifest.json").read_text())
        files = {Path(f["path"]).name: f for f in manifest["input"]["files"]}
        assert sorted(files) == sorted(["a.jsonl", "f.jsonl", *empty])
        assert files["b-empty.jsonl"]["sha256"] == hashlib.sha256(b"").hexdigest()
        assert files["c-blank.jsonl"] == {**files["c-blank.jsonl"], "format": "jsonl", "bytes": 6}
    # A job killed after its first part: the same command continues after it and writes the same bytes.
    expected = _digests(out)
    manifest["parts"], manifest["rows_done"], manifest["complete"] = manifest["parts"][:1], 4, False
    (out / "_manifest.json").write_text(json.dumps(manifest))
    for name in list(expected)[1:]:
        (out / name).unlink()
    code, lines = _run(capsys, *argv, "--input", str(data / "*"), "--output", out)
    assert code == 0 and lines[0] == "continuing after row 4 (1 parts done)", lines
    assert _digests(out) == expected


def test_inputs_that_are_all_empty_give_a_complete_output_of_no_parts_not_an_error(tiny, tmp_path, capsys):
    """No rows is a job of no rows (as a Parquet file of none): a manifest of no parts, exit 0, as a daily run over
    an empty day's files wants it; never a traceback."""
    data = tmp_path / "data"
    empty = _empty_files(data)
    for spec in (data, data / empty[0], data / empty[1]):
        out = tmp_path / f"out-{spec.name}"
        argv = ["--task", "classify", "--model", tiny, "--input", spec, "--output", out, "--keep", "id"]
        code, lines = _run(capsys, *argv)
        assert code == 0 and len(lines) == 1 and lines[0].startswith("done: 0 rows in 0 parts, 0 errors"), lines
        manifest = json.loads((out / "_manifest.json").read_text())
        assert manifest["complete"] and manifest["parts"] == [] and manifest["rows_done"] == 0
        assert len(manifest["input"]["files"]) == (len(empty) if spec == data else 1)
        assert not list(out.glob("part-*"))
        code, lines = _run(capsys, *argv)
        assert code == 0 and lines == [f"{out}: already complete (0 rows, 0 errors); --overwrite starts over"], lines


def test_each_input_is_read_once_before_the_jobs_own_pass(tiny, tmp_path, capsys, monkeypatch):
    """The manifest's sha256, the row count (the progress line's ETA) and the kept columns' types come from one
    read of each file: a JSONL file is opened three times, for its head (its columns), that read and the job's
    own pass, and the manifest and the parts are what they were."""
    import builtins

    source = _jsonl(tmp_path / "in.jsonl", [{**r, "id": r["id"] if r["id"] % 3 else f"s{r['id']}"} for r in _rows(30)])
    opened = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file) == source:
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    out = tmp_path / "out"
    argv = ["--task", "classify", "--model", tiny, "--input", source, "--output", out, "--keep", "id,text"]
    code, lines = _run(capsys, *argv, "--window-rows", 4, "--part-rows", 8)
    monkeypatch.setattr(builtins, "open", real_open)
    assert code == 0, lines
    assert len(opened) == 3, f"{source} opened {len(opened)} times"
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["input"]["files"][0]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    table = pq.read_table(out)
    assert table.schema.field("id").type == pa.string() and table.schema.field("text").type == pa.string()
    assert table["id"].to_pylist() == [f"s{i}" if i % 3 == 0 else str(i) for i in range(30)]


def test_a_jsonl_line_reads_as_json_loads_reads_it():
    """batch/inputs._json_record runs json's scanner itself (half the time of json.loads): the same value, or the
    same ValueError, for every line."""
    from batch.inputs import _json_record

    lines = [b'{"a": 1}', b'  {"a": [1, {"b": null}]}  \r\n', b'{"a": 1} x', b'{"a": 1}{"b": 2}', b"1, 2", b"NaN"]
    lines += [b'\xef\xbb\xbf{"a": 1}', b'\x0c{"a": 1}', b'{"a": 1}\x00', b'{"a": "caf\xe9"}', b'"\\ud800"', b"", b"{"]
    lines += [b'{"a": 1, "a": 2}', b"12345678901234567890123", b"1e400", b'\t"x"\t', b"tru"]

    def outcome(read, line):
        try:
            return repr(read(line))
        except ValueError as e:
            return f"{type(e).__name__}: {e}"

    def loads(line):
        try:
            return json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            return json.loads(line.decode("utf-8", "surrogateescape"))

    for line in lines:
        assert outcome(_json_record, line) == outcome(loads, line), line
