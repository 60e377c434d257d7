"""A tiny randomly initialised LLaMA with a character-level tokenizer, built offline: what
the tests run on, and what `scripts/tiny_model.py` writes for a smoke test of an
installed autotune (no weights need to be on the machine)."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

# A template of the tokenizer's own, so the "use the model's chat template" path is exercised.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer() -> Any:
    """Character-level tokenizer over printable ASCII and newline (99 ids).

    A BPE model with no merges splits text into single characters, so any ASCII text
    round-trips exactly through encode/decode; the post-processor adds BOS like LLaMA's.
    """
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(string.printable[:95]) + ["\n"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_llama(seed: int = 0, layers: int = 4) -> Any:
    """A LlamaForCausalLM of 4 layers, hidden size 64 and 128 tokens, in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config).eval()


def save_tiny_model(folder: str | Path, seed: int = 0) -> Path:
    """The tiny LLaMA and its tokenizer as a local Hugging Face model folder."""
    folder = Path(folder)
    tiny_llama(seed).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder
