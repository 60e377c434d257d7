"""Whether a method's greedy output that differs from plain greedy output is a numeric
tie or a loss.

Greedy speculative decoding emits the target's own argmax at every token, so its output
is plain greedy output exactly where the target's logits do not depend on how many tokens
a forward computes. They do, a little: the engine's products are chosen by row count (on
the CPU, the kernel table each machine measures; on a GPU, the library's kernels), and
other kernels sum in another order. On the CPU a verify pass and a one-token step agree
to about 1e-7; on an H200 (2026-11-28) a float32 product's first row differed by up to
5e-6 between 1 and 16 rows. Where the two best tokens' logits are closer than that, two
decodings can take different ones, and differ from there on.

Such a difference is judged here, at the first token where the outputs part: the
target's logits for that position are computed twice with the same runner, once by a
forward over the whole prefix and once by a forward over all but its last token and a
one-token step (the two ways the decodings computed them). Their largest difference is
this engine's own rounding at that position (unless it is a twentieth of the logits'
spread or more: then one of the computations is wrong). The two tokens' logits closer
than twice that are a tie: either token is the argmax within the engine's rounding, and
the method lost nothing. Further apart, the method changed the output."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autotune.engine.runner import Runner

# a tie: the two tokens' logits closer than this many times the engine's own disagreement
# with itself at that position (the verify step's kernels are a third computation, whose
# rounding is of the same size, not the same values)
TIE_NOISE_FACTOR = 2.0
# ...as long as that disagreement looks like rounding: a step that computes something else
# (stale inputs, a wrong cache column) disagrees by about the logits' whole spread, and
# would make every difference a "tie"; past this share of the spread it is a fault
NOISE_SPREAD_SHARE = 0.05


@dataclass(frozen=True)
class Divergence:
    """Where a method's greedy output parts from plain greedy output, and by how much."""

    at: int  # the index of the first token that differs
    method_token: int
    greedy_token: int
    gap: float  # |logit(greedy token) - logit(method token)| there, by a whole-prefix forward
    noise: float  # the largest logit difference between that forward and a one-token step
    spread: float = float("inf")  # max - min of that forward's logits

    @property
    def rounding(self) -> bool:
        """Whether the engine's disagreement with itself is of rounding's size."""
        return self.noise <= NOISE_SPREAD_SHARE * self.spread

    @property
    def tie(self) -> bool:
        return self.rounding and self.gap <= TIE_NOISE_FACTOR * self.noise

    def describe(self) -> str:
        if self.method_token < 0:
            return f"the outputs agree for {self.at} tokens, then one ends (not a tie)"
        verdict = "a numeric tie" if self.tie else "not a tie"
        if not self.rounding:
            verdict += ": the engine's two computations differ by more than rounding would"
        return (
            f"token {self.at} is {self.method_token}, plain greedy's {self.greedy_token}: their "
            f"logits differ by {self.gap:.3g}, the engine's own rounding there {self.noise:.3g} "
            f"({verdict})"
        )


def first_difference(method: list[int], greedy: list[int]) -> int | None:
    """The index of the first token that differs; None if the outputs are the same.
    Outputs of different lengths that agree where both have tokens part at the shorter's
    end (only the token limit can end them apart: an end token is kept in the output)."""
    at = next((i for i, (m, g) in enumerate(zip(method, greedy, strict=False)) if m != g), None)
    if at is None and len(method) != len(greedy):
        return min(len(method), len(greedy))
    return at


def judge(
    runner: Runner, prompt: list[int], method: list[int], greedy: list[int]
) -> Divergence | None:
    """None if ``method`` equals ``greedy`` (the outputs after ``prompt``), else where and
    by how much they part (``Divergence.tie`` says whether it is a numeric tie)."""
    at = first_difference(method, greedy)
    if at is None:
        return None
    if at >= min(len(method), len(greedy)):  # no token to compare: a loss
        return Divergence(at, -1, -1, float("inf"), 0.0)
    prefix = [*prompt, *greedy[:at]]
    whole = _last_logits(runner, prefix, split=False)
    stepped = _last_logits(runner, prefix, split=True)
    noise = float((whole - stepped).abs().max())
    gap = float((whole[greedy[at]] - whole[method[at]]).abs())
    spread = float(whole.max() - whole.min())
    return Divergence(at, method[at], greedy[at], gap, noise, spread)


def lossless(divergence: Divergence | None) -> bool:
    """Whether a method's greedy output, judged so (``judge``; None: the same as plain
    greedy output), lost nothing: the same, or parted at a numeric tie."""
    return divergence is None or divergence.tie


def lossless_up_to_a_tie(runner: Runner):
    """``(prompt, method, greedy) -> bool``: whether ``method``'s output is ``greedy``'s
    or parts from it at a numeric tie (``judge``), for comparisons that keep only a yes
    (the rounds under load, ``measure.load``: several sequences in one step round as
    other row counts do)."""

    def same(prompt: list[int], method: list[int], greedy: list[int]) -> bool:
        return lossless(judge(runner, list(prompt), list(method), list(greedy)))

    return same


@torch.inference_mode()
def _last_logits(runner: Runner, prefix: list[int], split: bool) -> torch.Tensor:
    """The logits after ``prefix`` in float32: from one forward over it, or (``split``)
    from a forward over all but its last token and then a one-token step."""
    device = runner.input_device
    cache = runner.new_cache(capacity=len(prefix) + 64)
    cut = len(prefix) - 1 if split and len(prefix) > 1 else len(prefix)
    out = runner.forward(
        torch.tensor(prefix[:cut], device=device),
        torch.arange(cut, device=device),
        cache,
        last_only=True,
    )
    if cut < len(prefix):
        out = runner.forward(
            torch.tensor(prefix[cut:], device=device),
            torch.tensor([cut], device=device),
            cache,
        )
    return out.logits[-1].float()
