"""SGLang: the speculative flags of its server (``python -m sglang.launch_server``):
``--speculative-algorithm EAGLE``, ``--speculative-draft-model-path``,
``--speculative-num-steps`` (draft forward passes: the tree's depth),
``--speculative-eagle-topk`` (children kept per node and step) and
``--speculative-num-draft-tokens`` (tokens verified, the root included).

SGLang grows its tree the EAGLE-2 way, so a dynamic profile maps onto it as it is; a
static tree is approximated by the dynamic tree of the same depth, branching and size."""
from __future__ import annotations

from autotune.engine.tree import check_tree
from autotune.export.base import Exporter, Rendered, cape_warning, comment_lines
from autotune.export.choices import is_chain, max_branching, tree_depth
from autotune.profile.schema import EagleMethod, Profile

TITLE = "SGLang"


def render(profile: Profile, method: str) -> Rendered:
    eagle: EagleMethod = profile.methods.eagle
    warnings: list[str] = []
    steps, topk, draft_tokens = _tree_flags(eagle, warnings)
    if eagle.draft_vocab:
        warnings.append(f"the draft vocabulary (the head folder's {eagle.draft_vocab} most "
                        f"frequent tokens, draft_vocab.json) is not passed: SGLang's "
                        f"--speculative-token-map takes its own table file of hot token ids; "
                        f"without one SGLang drafts over the whole vocabulary (same output, "
                        f"slower drafting)")
    warnings += cape_warning(TITLE, eagle.cape)
    flags = [("--speculative-algorithm", "EAGLE"),
             ("--speculative-draft-model-path", eagle.head),
             ("--speculative-num-steps", steps),
             ("--speculative-eagle-topk", topk),
             ("--speculative-num-draft-tokens", draft_tokens)]
    lines = comment_lines(EXPORTER, profile, method, warnings,
                          ["append these flags to: python -m sglang.launch_server "
                           "--model-path MODEL"])
    body = [f"{flag} {_quote(value)}" for flag, value in flags]
    lines += [line + " \\" for line in body[:-1]] + body[-1:]
    return Rendered("\n".join(lines) + "\n", warnings)


def _tree_flags(eagle: EagleMethod, warnings: list[str]) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens) for the profile's tree."""
    if eagle.tree.kind == "dynamic":
        dyn = eagle.tree
        # EAGLE-2 drafts depth + 1 levels but keeps only total_tokens - 1 nodes: a level
        # deeper than that could never be kept, so SGLang need not draft it
        return min(dyn.depth + 1, dyn.total_tokens - 1), dyn.top_k, dyn.total_tokens
    tree = check_tree(eagle.tree.choices)
    flags = tree_depth(tree), max_branching(tree), len(tree) + 1
    if not is_chain(tree):
        warnings.append(f"SGLang has no static tree: the tuned tree of {len(tree)} nodes is "
                        f"approximated by its dynamic tree of the same depth ({flags[0]}), "
                        f"branching ({flags[1]}) and size ({flags[2]} tokens verified)")
    return flags


def _quote(value) -> str:
    import shlex

    return shlex.quote(str(value))


EXPORTER = Exporter(
    engine="sglang", title=TITLE,
    engine_version="SGLang 0.4-0.5 server flags (python -m sglang.launch_server "
                   "--speculative-*)",
    filename="sglang_flags.txt",
    methods=("eagle",),
    cannot={"self_spec": "it drafts with a separate draft model and cannot skip the target's "
                         "own sublayers (layer-skip self-speculation)",
            "medusa": "it has no Medusa heads (its speculative algorithms are EAGLE, EAGLE3, "
                      "NEXTN, STANDALONE and NGRAM)"},
    render=render)
