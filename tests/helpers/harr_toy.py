"""A tiny random BERT query tower and a toy dense index, for the HARR tests (offline, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from harness.retrieval.encoders import EncoderSpec, default_encoder_path
from harness.retrieval.stochastic import QueryTower

TOPICS = [
    "glass harp clock",
    "steam loom",
    "river ferry",
    "copper mine",
    "salt marsh",
    "wind mill",
    "iron bridge",
    "paper mill",
    "silk road",
    "tea garden",
    "horse race",
    "wool market",
    "bell tower",
    "fish market",
    "stone quarry",
    "sugar refinery",
    "coal barge",
    "rope walk",
    "tin foundry",
    "brick kiln",
]


def tiny_tower(seed: int = 0, lora_r: int = 0) -> QueryTower:
    """A randomly initialised 1-layer BERT (hidden 32) on MiniLM's tokenizer, mean pooling."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(default_encoder_path())
    cfg = BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    spec = EncoderSpec("tiny-bert", "tiny-bert", "mean")
    return QueryTower(model=BertModel(cfg), tokenizer=tok, spec=spec, lora_r=lora_r, max_length=96)


def toy_corpus(path: Path, n: int = 20) -> list[dict]:
    """``n`` paragraphs, one per topic; doc ``d{i}`` is the only one naming the code word ``W{i}``."""
    rows = [
        {"id": f"d{i}", "contents": f"The {TOPICS[i % len(TOPICS)]}\nThe {TOPICS[i % len(TOPICS)]} keeps code W{i}."}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def toy_index(tmp: Path, tower: QueryTower, n: int = 20) -> Path:
    """A flat dense index over the toy corpus, built with ``tower`` (the fixed document vectors)."""
    from harness.retrieval.index import build_index

    corpus = tmp / "corpus.jsonl"
    toy_corpus(corpus, n)
    build_index(corpus, "dense", tmp / "index", encoder=tower)
    return tmp / "index"


class OracleReader:
    """A scripted frozen generator (search_r1 tags): searches the question once, then answers the
    gold code only when the document holding it (``... keeps code W{i}.``) is in an observation."""

    @staticmethod
    def backend(golds: dict[str, str]):
        from harness.backends.scripted import ScriptedBackend

        class _Oracle(ScriptedBackend):
            def _pick(self, context: str):
                question = next((q for q in golds if f"Question: {q}" in context), None)
                if question is None:
                    return self.default, None
                after = context.split(f"Question: {question}", 1)[1]
                if "<search>" not in after:
                    return f"<search>{question}</search>", None
                found = f"keeps code {golds[question]}." in after
                return f"<answer>{golds[question] if found else 'unknown'}</answer>", None

        return _Oracle()
