"""SQuAD data for fine-tuning and evaluation: windows with answer positions, predictions, EM/F1.

Reading the examples (and the `--heldout-articles N` split: the last N articles of the training files, file
order, never trained on) is the qa task's training hook, bert.tasks.qa.QATask.read_examples.
"""

from __future__ import annotations

import sys

from bert.tasks import qa as qa_codec
from training import metrics as M
from training.data.readers import QAExample


def train_features(
    tokenizer, examples: list[QAExample], *, max_seq_length: int, doc_stride: int, max_query_length: int
):
    """Every window of every question with its (start, end) token target; (0, 0) = [CLS] when the
    window lacks the answer or the question has none (SQuAD 2.0). Uses the first gold answer."""
    features, targets, skipped = [], [], 0
    for example in examples:
        if example.is_impossible or not example.answers:
            windows = qa_codec.encode(
                tokenizer,
                example.question,
                example.context,
                max_length=max_seq_length,
                doc_stride=doc_stride,
                max_query_length=max_query_length,
            )
            pairs = [(w, 0, 0) for w in windows]
        else:
            answer = example.answers[0]
            try:
                pairs = qa_codec.train_features(
                    tokenizer,
                    example.question,
                    example.context,
                    int(answer["answer_start"]),
                    answer["text"],
                    max_length=max_seq_length,
                    doc_stride=doc_stride,
                    max_query_length=max_query_length,
                )
            except ValueError:
                skipped += 1  # answer text not at its offset: unusable as a training target
                continue
        for window, start, end in pairs:
            features.append(window)
            targets.append((start, end))
    if skipped:
        print(f"qa: skipped {skipped} training questions whose answer is not at its offset", file=sys.stderr)
    return features, targets


def predict_qa(
    model,
    tokenizer,
    examples: list[QAExample],
    *,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    max_answer_length: int,
    batch_size: int = 64,
    handle_impossible_answer: bool = False,
) -> dict[str, str]:
    from training.task_data import run_model

    windows_of = [
        qa_codec.encode(
            tokenizer,
            e.question,
            e.context,
            max_length=max_seq_length,
            doc_stride=doc_stride,
            max_query_length=max_query_length,
        )
        for e in examples
    ]
    flat = [w for windows in windows_of for w in windows]
    outputs = run_model(
        model, flat, batch_size=batch_size, pad_token_id=tokenizer.pad_token_id, outputs=("start_logits", "end_logits")
    )
    predictions, cursor = {}, 0
    for example, windows in zip(examples, windows_of):
        mine = outputs[cursor : cursor + len(windows)]
        cursor += len(windows)
        answers = qa_codec.decode(
            example.context,
            windows,
            [o[0] for o in mine],
            [o[1] for o in mine],
            top_k=1,
            max_answer_len=max_answer_length,
            handle_impossible_answer=handle_impossible_answer,
        )
        predictions[example.id] = answers[0]["answer"] if answers else ""
    return predictions


def evaluate_qa(model, tokenizer, examples: list[QAExample], **settings) -> dict:
    impossible = any(e.is_impossible for e in examples)
    predictions = predict_qa(model, tokenizer, examples, handle_impossible_answer=impossible, **settings)
    gold = {e.id: [a["text"] for a in e.answers] for e in examples}
    return M.squad_metrics(predictions, gold)
