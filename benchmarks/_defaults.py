"""What each method family ships untuned: the settings a user deploys without autotune,
run by our drafters, in one place for every benchmark that measures against them
(``against_defaults.py``, ``end_to_end.py``, ``ngram.py``, ``eagle.py``, ``medusa.py``).

Sources:
  n-gram   transformers' prompt lookup (``prompt_lookup_num_tokens=10``, n-grams of size 2
           down to 1, the earliest match), vLLM's ``ngram`` speculator
           (``prompt_lookup_min = max = 5``, ``num_speculative_tokens 5``, its documented
           example) and vLLM's suffix decoding (the n-gram search space's suffix start)
  EAGLE    EAGLE-1's 25-node static tree and EAGLE-2's default dynamic expansion
           (total_tokens 60, depth 5, top_k 10), both over the whole vocabulary
  Medusa   Medusa's 63-node ``mc_sim_7b_63`` tree, clipped to the heads at hand
"""

from __future__ import annotations

from autotune.drafters.eagle import EAGLE1_TREE, DynamicTree, StaticTree
from autotune.drafters.ngram import LookupConfig
from autotune.drafters.suffix import SuffixConfig
from autotune.tuners.medusa_tree import MC_SIM_7B_63, clip_tree

TRANSFORMERS_DEFAULT = LookupConfig(1, 2, 10, 1, 1, 10, "first")
VLLM_DEFAULT = LookupConfig(5, 5, 5, 1, 1, 5, "first")

# EAGLE's published trees, by the names eagle.py reports them under
EAGLE_DEFAULTS: dict[str, StaticTree | DynamicTree] = {
    "eagle1_tree": StaticTree(EAGLE1_TREE),
    "eagle2_60_5_10": DynamicTree(total_tokens=60, depth=5, top_k=10),
}

# Families that publish no setting of their own to measure against, and why.
NO_DEFAULT = {
    "self_spec": "Draft & Verify publishes a way of searching a skip mask, not a mask for "
    "this model (benchmarks/self_spec.py measures that search)",
    "glide": "GLIDE publishes CAPE tables over its draft, not a draft setting "
    "(benchmarks/glide.py measures those tables)",
}


def ngram_defaults(space=None) -> dict[str, LookupConfig | SuffixConfig]:
    """The engines' n-gram settings, by name; ``space``: the n-gram search space, whose
    suffix start is vLLM's suffix decoding defaults (None: the packaged one)."""
    from autotune.methods import registry

    space = space or registry.method("ngram").space()
    return {
        "transformers prompt lookup": TRANSFORMERS_DEFAULT,
        "vLLM ngram": VLLM_DEFAULT,
        "vLLM suffix": SuffixConfig(**space.suffix.start.model_dump()),
    }


def medusa_defaults(num_heads: int) -> dict[str, list[tuple[int, ...]]]:
    """Medusa's published tree for ``num_heads`` heads: its paths deeper than the heads, or
    ranking wider than the Medusa search space counts (its calibration's ``max_rank``),
    dropped."""
    from autotune.methods import registry

    max_rank = registry.method("medusa").space().calibration.max_rank
    return {"mc_sim_7b_63": clip_tree(MC_SIM_7B_63, num_heads, max_rank)}
