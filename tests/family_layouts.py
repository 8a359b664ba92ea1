"""Rewrite a post-LN BERT checkpoint (all-MiniLM-L6-v2) exactly into another family's layout, so that every
family's code path runs on real weights (no pretrained RoBERTa, DistilBERT or ELECTRA weights are available
offline).

- RoBERTa: positions start at pad_token_id + 1, so the position table moves down pad_token_id + 1 rows; there
  is one token type, so BERT's type-0 row is folded into every position row and the type table is zero. The
  pooler stays (RobertaModel has one; a classifier fine-tuned from it starts from it, as from BERT's).
- DistilBERT: no token types at all: type 0 folded into the positions (exact for single segments, which is all
  DistilBERT ever sees); its own parameter and config names.
- ELECTRA: BERT with other names (embedding_size = hidden_size: no projection).

The tokenizer and sentence-transformers files are copied as they are (WordPiece: the segment structure of a
pair differs from a real RoBERTa's, but a single text is encoded the same).

    python tests/family_layouts.py SOURCE_DIR OUT_DIR roberta|distilbert|electra
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

LAYOUTS = ("roberta", "distilbert", "electra")
COPIED = (
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling",
)


def rewrite(source: Path, out: Path, model_type: str) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    from bert.families import family_of

    if model_type not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {model_type!r}")
    source, out = Path(source), Path(out)
    config = json.loads((source / "config.json").read_text())
    state = {
        k.removeprefix("bert."): v
        for k, v in load_file(source / "model.safetensors").items()
        if not k.endswith("position_ids")
    }
    positions = state.pop("embeddings.position_embeddings.weight")
    types = state.pop("embeddings.token_type_embeddings.weight")
    folded = positions + types[0]  # (P, H): every token is type 0
    if model_type != "roberta":  # RoBERTa's bare encoder keeps BERT's pooler; DistilBERT and ELECTRA have none
        state = {k: v for k, v in state.items() if not k.startswith("pooler.")}
    pad = config.get("pad_token_id", 0)
    if model_type == "roberta":
        offset = pad + 1
        table = torch.zeros(positions.shape[0] + offset, positions.shape[1], dtype=positions.dtype)
        table[offset:] = folded
        state["embeddings.position_embeddings.weight"] = table
        state["embeddings.token_type_embeddings.weight"] = torch.zeros_like(types[:1])
        config.update(
            model_type="roberta",
            architectures=["RobertaModel"],
            type_vocab_size=1,
            max_position_embeddings=positions.shape[0] + offset,
        )
    elif model_type == "distilbert":
        state["embeddings.position_embeddings.weight"] = folded
        family = family_of("distilbert")
        state = {family.name_from_bert(k): v for k, v in state.items()}
        config = {
            "model_type": "distilbert",
            "architectures": ["DistilBertModel"],
            "vocab_size": config["vocab_size"],
            "dim": config["hidden_size"],
            "n_layers": config["num_hidden_layers"],
            "n_heads": config["num_attention_heads"],
            "hidden_dim": config["intermediate_size"],
            "activation": config["hidden_act"],
            "max_position_embeddings": positions.shape[0],
            "pad_token_id": pad,
            "sinusoidal_pos_embds": False,
            "dropout": config["hidden_dropout_prob"],
            "attention_dropout": config["attention_probs_dropout_prob"],
            "initializer_range": 0.02,
        }
    else:
        state["embeddings.position_embeddings.weight"] = positions
        state["embeddings.token_type_embeddings.weight"] = types
        config.update(model_type="electra", architectures=["ElectraModel"], embedding_size=config["hidden_size"])
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in COPIED:
        path = source / name
        if path.is_dir():
            shutil.copytree(path, out / name, dirs_exist_ok=True)
        elif path.is_file():
            shutil.copy(path, out / name)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.rsplit("\n\n", 1)[-1])
    print(rewrite(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
