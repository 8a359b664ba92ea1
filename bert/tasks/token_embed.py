"""Token embeddings: every token's vector, text-embeddings-inference's /embed_all.

The encoder's last hidden state, one (H,) vector per token of each text, the special tokens ([CLS], [SEP]) included
and nothing pooled or normalised: what TEI's /embed_all answers, and sentence-transformers'
`encode(output_value="token_embeddings")` before its pooling. Any encoder serves it, as it serves the embed task,
but only a model the server names for it (`--token-embed-model`): its outputs are a copy of every token's state per
batch, which no other task pays for.

An answer is T x H floats per text: a request carries at most `max_client_batch_size` texts (413 beyond) of at most
the model's input length each (422 beyond, or cut with `truncate`), so at most that many token vectors.
"""

from __future__ import annotations

import numpy as np

from bert.tasks.base import (
    MODEL,
    PROMPT_NAME,
    TEI_TRUNCATE,
    TRUNCATION_DIRECTION,
    JobColumns,
    Route,
    Task,
    check_inputs,
    column_of,
    tei_texts_of,
    texts_param,
)
from bert.tasks.common import Limits, ModelFacts
from bert.tasks.embed import encode_each


class TokenEmbedTask(Task):
    """The encoder's last hidden state per token, as text-embeddings-inference's /embed_all answers it."""

    name = "token_embed"
    order = 45
    head = None
    encoder_output = "last_hidden_state"
    served_by_default = False
    architectures = ("BertModel",)
    graph_outputs = {"token_embeddings": "token_embed"}
    single_graph_outputs = {"token_embeddings": "token_embed"}
    routes = (
        Route(
            "/embed_all",
            "EmbedAllRequest",
            list[list[list[float]]],
            "Every token's vector of texts (text-embeddings-inference's /embed_all)",
            to_items=tei_texts_of,
            shape=lambda answers, body, info=None: answers,
            check=check_inputs,
            fields=(
                MODEL,
                texts_param("What is the capital of France?"),
                TEI_TRUNCATE,
                TRUNCATION_DIRECTION,
                PROMPT_NAME,
            ),
            doc="Per input, always a list: one vector per token of the text, its special tokens included (the "
            "encoder's last hidden state, neither pooled nor normalised), as text-embeddings-inference's /embed_all "
            "answers.",
        ),
    )

    job = JobColumns(
        inputs=("text",),
        arity=(1,),
        results=(("token_embeddings", ("list", "vector")),),
        values=lambda answers: {"token_embeddings": column_of(answers, lambda a: a)},
    )

    def encode_request(
        self,
        tokenizer,
        items: list,
        limits: Limits,
        *,
        truncate: bool = False,
        truncation_direction: str = "right",
        **_,
    ):
        return encode_each(tokenizer, items, limits, truncate=truncate, truncation_direction=truncation_direction)

    def decode_request(self, items, features, outputs, facts: ModelFacts, **_):
        return [np.asarray(o[0]["token_embed"], dtype=np.float32).tolist() for o in outputs]


TASK = TokenEmbedTask()
