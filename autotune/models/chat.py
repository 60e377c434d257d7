"""Chat formatting: one user turn -> the token ids the model expects before its answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# FastChat's vicuna_v1.1 conversation template (Vicuna v1.1 .. v1.5 were trained on it).
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)


def is_vicuna(*names: str) -> bool:
    """Vicuna checkpoints ship no chat_template (or a wrong one), so we recognise them by name."""
    return any("vicuna" in n.lower() for n in names if n)


def vicuna_prompt(user_text: str) -> str:
    return f"{VICUNA_SYSTEM} USER: {user_text} ASSISTANT:"


def _as_id_list(encoded: Any) -> list[int]:
    # transformers 5 may return a BatchEncoding/dict, a tensor, or a (batched) list.
    if isinstance(encoded, Mapping) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):
        encoded = encoded[0]
    return [int(i) for i in encoded]


def encode_chat(tokenizer: Any, user_text: str, vicuna: bool = False) -> list[int]:
    """Token ids of `user_text` as one user turn, ready for the assistant's reply."""
    return encode_conversation(tokenizer, [user_text], vicuna)


def encode_conversation(tokenizer: Any, turns: list[str], vicuna: bool = False) -> list[int]:
    """Token ids of alternating user / assistant turns (user first, user last), ready for
    the assistant's next reply."""
    roles = ["user" if i % 2 == 0 else "assistant" for i in range(len(turns))]
    if vicuna:
        # Plain tokenisation adds BOS exactly as the Vicuna (LLaMA) tokenizer does in training.
        text = vicuna_prompt(turns[0])
        for role, turn in zip(roles[1:], turns[1:]):
            text += f" {turn}</s>" if role == "assistant" else f"USER: {turn} ASSISTANT:"
        return _as_id_list(tokenizer(text)["input_ids"])
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": r, "content": t} for r, t in zip(roles, turns)]
        return _as_id_list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        )
    return _as_id_list(tokenizer("\n".join(turns))["input_ids"])
