"""Tokenizers that need no download.

``byte_tokenizer()`` builds a real Hugging Face fast tokenizer over raw UTF-8 bytes (256 byte
tokens plus a few specials) entirely in memory, with a small chat template. Tests, the scripted
backend and tiny offline training models use it, so they exercise the same tokenizer API as
real models.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

BYTE_SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")

# A minimal ChatML-like template, enough for code paths that call apply_chat_template.
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@lru_cache(maxsize=1)
def _byte_tokenizer_cached() -> Any:
    # deferred: transformers costs ~0.8 s at import
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE with no merges: every byte is one token, so encode/decode round-trip exactly.
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(BYTE_SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.model_max_length = 1 << 20
    return fast


def byte_tokenizer() -> Any:
    """A fresh copy-safe handle to the in-memory byte tokenizer (vocab size 260)."""
    return _byte_tokenizer_cached()
