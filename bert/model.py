"""The encoder skeleton, its one forward, and transformers' classes around it.

Embeddings, layers and pooler, each layer assembled from the building blocks its family chooses (bert/blocks/:
attention, MLP, norm placement; positions per the config). Attribute paths equal transformers'
`modeling_bert.py`, so a Hugging Face state dict loads key for key (see checkpoint.py). The forward pass has no
`.item()` and no branch on tensor values, so the same module traces cleanly for ONNX export. The same modules also
run packed batches (only the real tokens, sequence after sequence): a `Packing` passed in place of the attention
mask selects the "varlen" attention implementation, as transformers selects its `attn_implementation`; serving's
fast path is that and no other copy of the encoder.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import heads
from .blocks.attention import ATTENTIONS, DotProductAttention
from .blocks.basics import Packing, activation, additive_padding_mask, layer_norm
from .blocks.mlp import MLPS
from .blocks.norms import NORMS
from .blocks.positions import RelativePositions, distance_index, relative_positions, rotary_tables, windowed_mask
from .config import BertConfig, head_layout
from .heads import BertLMPredictionHead, BertOnlyMLMHead
from .losses import IGNORE_INDEX
from .pooling import POOLINGS, pool
from .tasks import registry
from .tasks.registry import TASKS

# ----------------------------------------------------------------------------- encoder


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        width = config.embedding_width  # ELECTRA's tables are narrower than H (BertModel.embeddings_project)
        offset = config.position_offset  # RoBERTa's positions start after pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        # rotary positions (config.rope_theta) rotate queries and keys inside attention instead of a table here
        # and a model whose positions are only relative (position_biased_input false) has no table either
        table = config.position_table
        self.position_embeddings = nn.Embedding(config.max_position_embeddings + offset, width) if table else None
        # DistilBERT has no token types; RoBERTa one, so whatever ids a pair template gives, every token is type 0
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size else None
        self.single_token_type = config.type_vocab_size == 1
        self.position_offset = offset
        # DistilBERT's option: fixed sin/cos positions instead of learned ones (set at init, never trained)
        self.sinusoidal = bool(config.extra.get("sinusoidal_pos_embds", False))
        self.LayerNorm = layer_norm(config, width)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Sliced per call rather than arange(T): the same numbers, but the graph pattern
        # (Shape-Slice-Gather) onnxruntime's EmbedLayerNormalization fusion matches. Not saved.
        self.register_buffer(
            "position_ids", torch.arange(offset, config.max_position_embeddings + offset)[None, :], persistent=False
        )

    def fill_sinusoidal(self) -> None:
        """The position table as transformers' DistilBERT makes it when sinusoidal_pos_embds is set."""
        rows, dim = self.position_embeddings.weight.shape
        position = torch.arange(rows, dtype=torch.float64)[:, None]
        angle = position / torch.pow(10000.0, 2 * (torch.arange(dim) // 2) / dim).double()[None, :]
        with torch.no_grad():
            self.position_embeddings.weight[:, 0::2] = torch.sin(angle[:, 0::2]).float()
            self.position_embeddings.weight[:, 1::2] = torch.cos(angle[:, 1::2]).float()
        self.position_embeddings.weight.requires_grad = False

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:
            if self.single_token_type:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            # (1, T) for a padded batch; a packed one gives each token's own position, (N,)
            if position_ids is None:
                positions = self.position_ids[:, : input_ids.shape[1]]
            else:
                positions = position_ids + self.position_offset if self.position_offset else position_ids
            x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig, in_features: int | None = None, bias: bool = True):
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size, bias=bias)
        self.LayerNorm = NORMS[config.family.norm].residual_norm(config)  # nn.Identity where the family pre-norms
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(y)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__()
        self.self = ATTENTIONS[config.family.attention](config, index)
        self.output = BertSelfOutput(config, bias=config.attention_bias is not False)

    def forward(self, x: torch.Tensor, normed: torch.Tensor, mask, rope=None, relative=None) -> torch.Tensor:
        """normed: the sublayer's input (x itself where the family post-norms)."""
        return self.output(self.self(normed, mask, rope, relative), x)


class BertOutput(BertSelfOutput):
    """Feed-forward output: project the intermediate width back to H, then the same residual (+ LayerNorm)."""

    def __init__(self, config: BertConfig):
        super().__init__(config, config.intermediate_size, bias=config.mlp_bias is not False)


class BertLayer(nn.Module):
    """Attention then MLP, each added to the residual stream; the family's kinds of each (bert/blocks/) and its
    norm placement, which gives the norms that a placement lacks as nn.Identity."""

    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__()
        self.attention = BertAttention(config, index)
        self.intermediate = MLPS[config.family.mlp](config)
        self.output = BertOutput(config)
        norms = NORMS[config.family.norm]
        self.attention_norm = norms.sublayer_norm(config, index, "attention")
        self.mlp_norm = norms.sublayer_norm(config, index, "mlp")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Packing | None, rope=None, relative=None) -> torch.Tensor:
        gelu_epilogue = isinstance(mask, Packing) and mask.gelu_epilogue
        x = self.attention(x, self.attention_norm(x), mask, rope, relative)
        return self.output(self.intermediate(self.mlp_norm(x), gelu_epilogue), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = NORMS[config.family.norm].final_norm(config)  # nn.Identity where the family post-norms
        self.head_size = config.head_size
        self.gradient_checkpointing = False
        # Disentangled attention: one table of relative-position embeddings (2 * span rows) that every layer
        # projects with its own query and key weights, through a LayerNorm first where norm_rel_ebd says so.
        span = config.relative_span
        self.relative = (span, config.position_buckets or -1, config.relative_max_position)
        self.rel_embeddings = nn.Embedding(2 * span, config.hidden_size) if span else None
        # Every distance's row in that table, for distances -(P-1)..P-1 (P: max_position_embeddings), made once:
        # a (T, T) index is then integer arithmetic and one lookup, so an exported graph holds no float bucket
        # arithmetic (which fp16 conversion would round) and nothing to recompute per call. Not saved.
        reach = config.max_position_embeddings - 1
        distances = torch.arange(-reach, reach + 1) if span else torch.zeros(0, dtype=torch.long)
        self.register_buffer(
            "relative_rows", distance_index(distances, *self.relative) if span else distances, persistent=False
        )
        # (the norm exists whenever norm_rel_ebd names it, as in transformers, though unused without the table)
        self.rel_embeddings_norm = layer_norm(config) if config.norm_rel_ebd == "layer_norm" else None

    def relative_inputs(self, x: torch.Tensor, mask: torch.Tensor | Packing | None) -> RelativePositions | None:
        """The relative index and embeddings every layer reads, once per forward (None without relative attention)."""
        if self.rel_embeddings is None:
            return None
        table = self.rel_embeddings.weight
        if self.rel_embeddings_norm is not None:
            table = self.rel_embeddings_norm(table)
        return relative_positions(table, self.relative_rows, x, mask)

    def layer_inputs(self, x: torch.Tensor, mask: torch.Tensor | Packing | None, positions: torch.Tensor | None):
        """Per layer, its mask (windowed where the layer is) and rotary tables, each made once per distinct value."""
        masks: dict = {None: mask}
        tables: dict = {None: None}
        for block in self.layer:
            attention = block.attention.self
            if attention.window not in masks:  # a Packing carries no mask: the kernel bounds the window
                masks[attention.window] = (
                    mask
                    if isinstance(mask, Packing)
                    else windowed_mask(mask, x.shape[1], attention.window, x.dtype, x.device)
                )
            if attention.rope_theta not in tables:
                where = positions if positions is not None else torch.arange(x.shape[1], device=x.device)[None, :]
                tables[attention.rope_theta] = rotary_tables(where, self.head_size, attention.rope_theta)
        return [(masks[b.attention.self.window], tables[b.attention.self.rope_theta]) for b in self.layer]

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | Packing | None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """positions: each packed token's position in its sequence (N,); None for a padded batch (0..T-1)."""
        relative = self.relative_inputs(x, mask)
        for block, (layer_mask, rope) in zip(self.layer, self.layer_inputs(x, mask, positions)):
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, layer_mask, rope, relative, use_reentrant=False)
            else:
                x = block(x, layer_mask, rope, relative)
        return self.final_norm(x)


class BertPooler(nn.Module):
    """The first token's state through dense + activation: BERT's pooler (tanh), and what the other families
    put before a sequence classifier (RoBERTa's classifier.dense, tanh; ELECTRA's, GELU; DistilBERT's
    pre_classifier, ReLU: bert/families/ maps their names here)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias is not False)
        self.act = activation(config.classifier_activation or config.family.pooler_activation)
        # ModernBERT's head ends in a LayerNorm (config.family.pooler_norm)
        self.LayerNorm = layer_norm(config) if config.family.pooler_norm else None

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        y = self.act(self.dense(first_token))  # (B, H): the [CLS] states (or what classifier_pooling pools)
        return y if self.LayerNorm is None else self.LayerNorm(y)


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooler_output: torch.Tensor | None = None  # (B, H)
    embedding: torch.Tensor | None = None  # (B, H): the sentence embedding, when the encoder has a pooling mode
    # config.family.token_head_transform: the pooler's transform, which that family's per-token heads read too
    token_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    # what the encoder ran with: the (B, T) 1/0 mask, a Packing, or None (nothing padded); a head that pools over
    # the real tokens reads it
    attention_mask: torch.Tensor | Packing | None = None

    def token_states(self) -> torch.Tensor:
        """What a per-token head (token, span) reads: the token states, through token_transform if there is one."""
        if self.token_transform is None:
            return self.last_hidden_state
        return self.token_transform(self.last_hidden_state)


# False while a model is built only to have every parameter overwritten from a file (bert.checkpoint's
# load_for_inference): drawing random weights first costs seconds on a large model and changes nothing.
_RANDOM_INIT: contextvars.ContextVar[bool] = contextvars.ContextVar("random_init", default=True)


@contextlib.contextmanager
def without_random_init():
    """Build models whose parameters will all be loaded: init_weights leaves their random draws out (sinusoidal
    tables and tied weights are still set). Whatever is not then loaded must be initialised by the caller."""
    token = _RANDOM_INIT.set(False)
    try:
        yield
    finally:
        _RANDOM_INIT.reset(token)


class BertPreTrainedModel(nn.Module):
    """Shared init and helpers. Subclasses set `base_model_prefix`-style attributes as transformers does."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        if _RANDOM_INIT.get():
            self.apply(self._init_module)
        for module in self.modules():
            if isinstance(module, BertEmbeddings) and module.sinusoidal:
                module.fill_sinusoidal()
        self.tie_weights()

    def _init_module(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, BertLMPredictionHead) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def tie_weights(self) -> None:
        """Heads that share parameters with the encoder override this."""

    def fuse_qkv(self) -> None:
        """Stack each layer's query, key and value weights for the varlen path (after moving the model)."""
        for module in self.modules():
            if isinstance(module, DotProductAttention):
                module.fuse_qkv()

    def set_attention_implementation(self, implementation: str) -> None:
        if implementation not in ("sdpa", "eager"):
            raise ValueError(f"attention implementation must be 'sdpa' or 'eager', got {implementation!r}")
        for module in self.modules():
            if isinstance(module, DotProductAttention):
                module.implementation = implementation

    @property
    def architecture(self) -> str:
        """The class name config.json records: transformers (and bert.checkpoint) load the weights by it."""
        return type(self).__name__

    def encoder_module(self) -> "BertModel":
        return self if isinstance(self, BertModel) else self.bert

    def set_pooling(self, mode: str | None) -> None:
        """Make every forward also return `embedding`, the encoder's states pooled (cls | mean | max), beside
        what the heads compute (one forward pass serves both); None turns it off."""
        if mode is not None and mode not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {mode!r}")
        self.encoder_module().pooling = mode

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooling_layer: bool | None = None):
        """add_pooling_layer: None gives a bare encoder of the config's family its pooler where it has one."""
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        # ELECTRA: embeddings narrower than the encoder, projected up (an attribute of the encoder, as there)
        self.embeddings_project = (
            nn.Linear(config.embedding_width, config.hidden_size)
            if config.embedding_width != config.hidden_size
            else None
        )
        self.encoder = BertEncoder(config)
        if add_pooling_layer is None:
            add_pooling_layer = config.family.bare_pooler
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.pooling: str | None = None  # see set_pooling
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | Packing | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """input_ids (B, T) with a (B, T) 1/0 attention_mask, or (N,) packed tokens with a Packing in its place
        (then every (B, ...) result below is (S, ...) and every (B, T, ...) one (N, ...))."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        packed = isinstance(attention_mask, Packing)
        x = self.embeddings(input_ids, token_type_ids, attention_mask.positions if packed else None)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        if packed:
            mask = attention_mask
        else:
            # No mask means nothing is padded: SDPA then gets no mask and may use its flash kernel, which
            # any attn_mask rules out (on CUDA, fp16 BERT-large at 32 x 384).
            mask = additive_padding_mask(attention_mask, x.dtype) if attention_mask is not None else None
        x = self.encoder(x, mask, attention_mask.positions if packed else None)
        pooler_output = None
        if self.pooler is not None:
            if self.config.classifier_pooling == "mean":
                first = pool(x, attention_mask, "mean")
            else:
                first = x.index_select(0, attention_mask.cls_rows) if packed else x[:, 0]
            pooler_output = self.pooler(first)
        transform = self.pooler if self.pooler is not None and self.config.family.token_head_transform else None
        return EncoderOutput(
            x,
            pooler_output,
            pool(x, attention_mask, self.pooling) if self.pooling is not None else None,
            transform,
            attention_mask,
        )


# ----------------------------------------------------------------------------- heads


class BertPreTrainingHeads(BertOnlyMLMHead):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


@dataclass
class PreTrainingOutput:
    mlm_logits: torch.Tensor  # (B, T, V), or (N, V) over the labelled positions when mlm_labels is given
    nsp_logits: torch.Tensor | None = None  # (B, 2)
    loss: torch.Tensor | None = None  # mlm_loss + nsp_loss
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None


class BertForMaskedLM(BertPreTrainedModel):
    """MLM only (no NSP head, no pooler), as RoBERTa-style pretraining uses."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.init_weights()

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def mlm(self, hidden: torch.Tensor, mlm_labels: torch.Tensor | None):
        """Logits and loss; with labels, the vocabulary projection runs only on labelled positions
        (about 15 % of tokens), which is most of the head's cost."""
        if mlm_labels is None:
            return self.cls.predictions(hidden), None
        selected = mlm_labels != IGNORE_INDEX
        logits = self.cls.predictions(hidden[selected])  # (N, V)
        return logits, F.cross_entropy(logits.float(), mlm_labels[selected])

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, mlm_labels=None) -> PreTrainingOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits, loss = self.mlm(hidden, mlm_labels)
        return PreTrainingOutput(logits, None, loss, loss, None)


class BertForPreTraining(BertForMaskedLM):
    """Masked LM + next sentence prediction on the pooled [CLS] (the paper's objective)."""

    def __init__(self, config: BertConfig):
        BertPreTrainedModel.__init__(self, config)
        self.bert = BertModel(config, add_pooling_layer=True)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, mlm_labels=None, nsp_labels=None
    ) -> PreTrainingOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids)
        mlm_logits, mlm_loss = self.mlm(out.last_hidden_state, mlm_labels)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)
        nsp_loss = F.cross_entropy(nsp_logits.float(), nsp_labels) if nsp_labels is not None else None
        losses = [loss for loss in (mlm_loss, nsp_loss) if loss is not None]
        return PreTrainingOutput(mlm_logits, nsp_logits, sum(losses) if losses else None, mlm_loss, nsp_loss)


@dataclass
class ClassifierOutput:
    logits: torch.Tensor  # (B, L) per sequence, or (B, T, L) per token
    embedding: torch.Tensor | None = None  # (B, H), with set_pooling


def classifier_dropout(config: BertConfig) -> nn.Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


# transformers' single-task classes, for inference and for checkpoints written in their layout. They compute no
# loss: training runs BertForMultiTask with each task's Task.loss (training.finetune builds it with one head at
# the attribute these classes have, so that what it writes is theirs).


class BertForSequenceClassification(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=True)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> ClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids)
        return ClassifierOutput(self.classifier(self.dropout(out.pooler_output)), out.embedding)


class BertForTokenClassification(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=config.family.token_head_transform)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> ClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids)
        return ClassifierOutput(self.classifier(self.dropout(out.token_states())), out.embedding)  # (B, T, L)


@dataclass
class SpanOutput:
    start_logits: torch.Tensor  # (B, T)
    end_logits: torch.Tensor  # (B, T)
    embedding: torch.Tensor | None = None  # (B, H), with set_pooling


class BertForQuestionAnswering(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=config.family.token_head_transform)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # start and end vectors S, E
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> SpanOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids)
        start_logits, end_logits = self.qa_outputs(out.token_states()).unbind(dim=-1)
        return SpanOutput(start_logits, end_logits, out.embedding)


class MultiTaskOutput:
    """Every head's outputs under their graph-output names ("classify_logits", "qa_start_logits", ...; the
    registry's `graph_outputs`), as attributes, plus the pooled `embedding` when asked for (set_pooling) and the
    token states when asked for (BertForMultiTask.gives_token_states)."""

    def __init__(
        self,
        outputs: dict[str, torch.Tensor],
        embedding: torch.Tensor | None = None,
        last_hidden_state: torch.Tensor | None = None,
    ):
        self.outputs = dict(outputs)
        self.embedding = embedding
        states = {"embedding": embedding, "last_hidden_state": last_hidden_state}
        for task in TASKS.values():  # the tasks without a head read the encoder output they declare, as given
            if task.head is None and states[task.encoder_output] is not None:
                self.outputs.update(dict.fromkeys(task.graph_outputs, states[task.encoder_output]))

    def __getattr__(self, name: str):
        outputs = self.__dict__.get("outputs", {})
        if name in outputs:
            return outputs[name]
        if any(name in task.graph_outputs or name in task.single_graph_outputs for task in TASKS.values()):
            return None  # a task's output this model has no head for
        raise AttributeError(name)


class BertForMultiTask(BertPreTrainedModel):
    """One shared encoder with a head per task, so one forward pass answers any mix of the served tasks'
    requests. Heads are built from the tasks' declarations (bert.tasks.base.Head); the encoder keeps
    transformers' names, so any BERT backbone loads into it, and so does any checkpoint made for one task
    (head_layout: its heads at their single-task attributes). Tasks whose heads sit at one attribute share
    that head and its outputs (a one-output classifier: classify and rerank); heads of different kinds that build
    the same module (HeadKind.module) share the module and each computes its own outputs from it (a masked-LM
    head's candidates and another reading of its logits).

    tasks (task -> labels) and attributes (task -> where its head sits) default to head_layout(config)."""

    def __init__(
        self, config: BertConfig, tasks: dict[str, list] | None = None, attributes: dict[str, str] | None = None
    ):
        super().__init__(config)
        layout_tasks, layout_attributes = head_layout(config) if tasks is None else ({}, {})
        tasks = dict(layout_tasks if tasks is None else tasks)
        for name in tasks:
            if name not in TASKS or TASKS[name].head is None:
                raise ValueError(f"{name!r} is not a task with a head ({', '.join(registry.with_heads())})")
        # task -> its Head declaration and labels, in registry order
        self.heads = {name: TASKS[name].head for name in TASKS if name in tasks}
        self.task_labels = {name: list(tasks[name] or []) for name in self.heads}
        self.attributes = {
            name: (attributes or {}).get(name) or layout_attributes.get(name) or self.heads[name].attribute
            for name in self.heads
        }
        # a family whose per-token heads read the pooler's transform (token_head_transform) needs it for them too
        self.bert = BertModel(
            config,
            add_pooling_layer=any(
                heads.get(h.kind).pooled or (config.family.token_head_transform and heads.get(h.kind).token_states)
                for h in self.heads.values()
            ),
        )
        self.dropout = classifier_dropout(config)
        # Whether forward also hands every token's last hidden state to the tasks without a head that read it (as
        # set_pooling does the pooled states): off unless asked, since a backend copies every output it is handed.
        self.gives_token_states = False
        built: dict[str, tuple[str, int]] = {}
        for name, head in self.heads.items():
            attribute, width = self.attributes[name], TASKS[name].head_width(self.task_labels[name])
            module = heads.get(head.kind).module
            if attribute in built:
                if built[attribute] != (module, width):
                    raise ValueError(
                        f"tasks sharing the head {attribute!r} need the same module and width: "
                        f"{built[attribute]} and {(module, width)} ({name})"
                    )
                continue
            built[attribute] = (module, width)
            setattr(self, attribute, heads.get(head.kind).build(config, width))
        self.init_weights()

    def tie_weights(self) -> None:
        for name, head in getattr(self, "heads", {}).items():
            heads.get(head.kind).tie(getattr(self, self.attributes[name]), self.bert.embeddings.word_embeddings)

    @property
    def tasks(self) -> list[str]:
        return list(self.heads)

    @property
    def architecture(self) -> str:
        """A model for one task alone (no task_labels, its head at transformers' name: what fine-tuning trains)
        is that task's single-task class in config.json, so that AutoModelFor... loads it; any other, ours."""
        single = {TASKS[name].architecture for name in self.heads}
        at_single = all(self.attributes[name] == head.single_attribute for name, head in self.heads.items())
        if self.heads and at_single and not self.config.task_labels and len(single) == 1:
            return single.pop()
        return type(self).__name__

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> MultiTaskOutput:
        """Padded (B, T) inputs, or packed (N,) ones with a Packing as attention_mask: sequence heads then give
        one row per sequence (S, ...), the others one per token (N, ...)."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        outputs, computed, read = {}, {}, {}
        for name, head in self.heads.items():
            attribute, kind = self.attributes[name], heads.get(head.kind)
            key = (attribute, head.kind)
            if key not in computed:
                if attribute not in read:  # kinds sharing a module share its work (a masked LM's logits, once)
                    read[attribute] = kind.read(getattr(self, attribute), out)
                computed[key] = kind.run(read[attribute], out, self.dropout)
            outputs.update(zip(TASKS[name].graph_outputs, computed[key]))
        return MultiTaskOutput(outputs, out.embedding, out.last_hidden_state if self.gives_token_states else None)


# Architecture name in config.json -> class. Names match transformers' where the class exists there.
ARCHITECTURES: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForMaskedLM,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertForQuestionAnswering,
        BertForMultiTask,
    )
}
# Task -> the class of a checkpoint made for it alone (the registry names it; embed: the bare encoder).
TASK_ARCHITECTURES = {task.name: ARCHITECTURES[task.architecture] for task in TASKS.values() if task.architecture}
