"""DeBERTa-v3-xsmall-shaped /classify against the peers: bertserve's default export against infinity's engines and
transformers' eager model, all serving the same directory.

    python -m bench.peers.deberta_xsmall --concurrency 8,32 --seconds 15 [other python -m bench.peers options]

Makes (once; cached under the work directory, keyed by this file) what microsoft/deberta-v3-xsmall looks like,
with random weights (seed 0): 12 layers, hidden 384, 6 heads, intermediate 1536, a 128,100-row embedding, DeBERTa-v3's
attention settings (relative attention, c2p and p2c, 256 position buckets, a LayerNorm over the relative
embeddings, shared keys, no absolute positions, no token types), a two-label sequence classifier written by
transformers' save_pretrained, and a Unigram tokenizer.json (▁ word starts) trained on WikiText-2 and SST-2 train
(as many pieces as that text gives, up to 32,000: no corpus here yields DeBERTa-v3's 128,000). Then runs
`python -m bench.peers --task classify --classify-model THAT_DIR` with the options given: every classify peer, the
fp32 reference and the table, as bench/peers/__main__.py describes. A peer that cannot serve DeBERTa-v2 is skipped
with its reason in the table and the JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.common import DATA_DIR
from bench.peers import WORK
from bench.peers.catalog import cached, fingerprint

WIKITEXT = Path("wikitext-2-raw") / "wiki.test.raw"  # under DATA_DIR: what the tokenizer is trained on
SST2_TRAIN = Path("SST-2") / "train.tsv"
SHAPE = dict(
    vocab_size=128100,
    hidden_size=384,
    num_hidden_layers=12,
    num_attention_heads=6,
    intermediate_size=1536,
    max_position_embeddings=512,
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=256,
    max_relative_positions=-1,
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    position_biased_input=False,
    type_vocab_size=0,
    pad_token_id=0,
    layer_norm_eps=1e-7,
    hidden_act="gelu",
)


def make_model(out: Path) -> None:
    import tempfile

    import torch
    import transformers

    from training.data.wikitext import wikitext_to_corpus
    from training.pretrain import train_unigram

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "wikitext.txt"
        wikitext_to_corpus(DATA_DIR / WIKITEXT, corpus)
        sst2 = Path(tmp) / "sst2.txt"
        rows = (DATA_DIR / SST2_TRAIN).read_text(encoding="utf-8").splitlines()[1:]
        sst2.write_text("\n".join(row.split("\t")[0] for row in rows) + "\n", encoding="utf-8")
        tokenizer = train_unigram([corpus, sst2], vocab_size=32000, model_max_length=512)
    tokenizer.save(out)
    labels = ["negative", "positive"]
    config = transformers.DebertaV2Config(
        **SHAPE, id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)}
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.DebertaV2ForSequenceClassification(config).eval()
    model.save_pretrained(out)
    print(
        f"made {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"a {tokenizer.vocab_size}-piece Unigram tokenizer",
        flush=True,
    )


def model_dir(work: Path) -> Path:
    return cached(work / "deberta-v3-xsmall-shaped", fingerprint(Path(__file__)), make_model)


def main(argv=None) -> int:
    from bench.peers.__main__ import main as peers_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:  # the options are bench.peers': its help needs no model made
        return peers_main(["--task", "classify", *argv])
    missing = [p for p in (WIKITEXT, SST2_TRAIN) if not (DATA_DIR / p).is_file()]
    if missing:
        print(
            f"bench.peers.deberta_xsmall: {DATA_DIR / missing[0]} not found: the tokenizer is trained on it",
            file=sys.stderr,
        )
        return 2
    work = Path(argv[argv.index("--work-dir") + 1]) if "--work-dir" in argv else WORK
    return peers_main(["--task", "classify", "--classify-model", str(model_dir(work)), *argv])


if __name__ == "__main__":
    sys.exit(main())
