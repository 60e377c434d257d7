"""transformers' own ``generate``, greedy, with an exported generation setting."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from autotune.serving import Decoded

# transformers' prompt lookup as its documentation shows it (generation strategies)
OWN_DEFAULT = {"prompt_lookup_num_tokens": 10}


def release() -> str:
    import transformers

    return f"transformers {transformers.__version__}"


def decoder(model: Any, settings: dict) -> Callable[[Sequence[int], int], Decoded]:
    """Decoding with ``settings`` as keyword arguments of ``generate`` (as the export's
    note tells users): ``decode(ids, max_new_tokens)``."""
    return lambda ids, max_new_tokens: decode(model, ids, max_new_tokens, settings)


def decode(model: Any, ids: Sequence[int], max_new_tokens: int, settings: dict) -> Decoded:
    """Greedy ``generate`` of the token ids ``ids`` with ``settings`` as its keyword
    arguments; the seconds include the prefill, the same for every setting."""
    import torch

    inputs = torch.tensor([list(ids)], device=model.device)
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.generation_config.eos_token_id
    if isinstance(pad, (list, tuple)):
        pad = pad[0]
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(
            inputs, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad, **settings
        )
        seconds = time.perf_counter() - start
    return Decoded(tokens=out[0, len(ids) :].tolist(), seconds=seconds)
