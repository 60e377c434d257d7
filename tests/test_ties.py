"""A greedy output that parts from plain greedy output: a numeric tie (the engine's own
rounding decides between two tokens) or a loss, judged by the target's logits there."""

from __future__ import annotations

import pytest
import torch

from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.measure import timing
from autotune.measure.shared_greedy import LossyDecoding, SharedGreedy
from autotune.measure.ties import first_difference, judge
from autotune.measure.timing import EncodedPrompt, SideBySide

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [1, 5, 9, 33, 70, 4]


class RoundsApart(Runner):
    """The tiny LLaMA, its one-token steps rounding otherwise than its longer forwards
    (as a GPU's kernels do): their logits shifted by a fixed pattern of size ``shift``."""

    def __init__(self, model, shift: float):
        super().__init__(model)
        self.pattern = shift * torch.sin(torch.arange(model.config.vocab_size, dtype=torch.float))

    def forward(self, ids, positions, cache, *args, **kwargs):
        out = super().forward(ids, positions, cache, *args, **kwargs)
        if len(ids) == 1:
            out.logits = out.logits + self.pattern.to(out.logits.dtype)
        return out


def runner_up(runner: Runner, prefix: list[int], token: int) -> tuple[int, float]:
    """The token after ``prefix`` most likely but ``token`` (by a whole-prefix forward),
    and how far its logit is from ``token``'s."""
    cache = runner.new_cache(capacity=len(prefix) + 8)
    out = runner.forward(torch.tensor(prefix), torch.arange(len(prefix)), cache, last_only=True)
    logits = out.logits[-1].float().clone()
    mine = float(logits[token])
    logits[token] = -float("inf")
    other = int(logits.argmax())
    return other, abs(mine - float(logits[other]))


def closest_call(runner: Runner, greedy: list[int]) -> tuple[int, int, float]:
    """Where the runner's greedy output comes closest to another token: (how many of its
    tokens come first, that token, its logit's distance from the best)."""
    calls = [(n, *runner_up(runner, [*PROMPT, *greedy[:n]], greedy[n])) for n in range(8)]
    return min(calls, key=lambda call: call[2])


# a shift within rounding's share of the tiny LLaMA's logits' spread (about 0.8)
SHIFT = 0.02


def test_the_first_difference_and_outputs_cut_apart():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 4, 5], [1, 2, 3, 5]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_outputs_that_end_apart_are_a_loss(tiny_llama):
    divergence = judge(Runner(tiny_llama), PROMPT, [1, 2], [1, 2, 3])
    assert divergence is not None and not divergence.tie
    assert divergence.describe() == "the outputs agree for 2 tokens, then one ends (not a tie)"


def test_the_same_output_is_no_divergence(tiny_llama):
    runner = Runner(tiny_llama)
    greedy = decode_plain(runner, PROMPT, 12).tokens
    assert judge(runner, PROMPT, list(greedy), greedy) is None


def test_a_token_outside_the_engines_rounding_is_a_loss(tiny_llama):
    """Here a whole-prefix forward and a one-token step agree to 1e-7 or so (the CPU's
    products, chosen by row count, round a little otherwise): the runner-up token, far
    further behind, changed the output."""
    runner = Runner(tiny_llama)
    greedy = decode_plain(runner, PROMPT, 12).tokens
    other, gap = runner_up(runner, [*PROMPT, *greedy[:5]], greedy[5])
    method = [*greedy[:5], other, *greedy[6:]]
    divergence = judge(runner, PROMPT, method, greedy)
    assert divergence is not None and divergence.at == 5
    assert (divergence.method_token, divergence.greedy_token) == (other, greedy[5])
    assert divergence.gap == pytest.approx(gap, rel=1e-4) and divergence.gap > 0
    assert divergence.noise < 1e-4
    assert not divergence.tie
    assert "not a tie" in divergence.describe()


def test_where_steps_round_otherwise_a_close_second_token_is_a_tie(tiny_llama):
    runner = RoundsApart(tiny_llama, SHIFT)
    greedy = decode_plain(runner, PROMPT, 12).tokens
    prefix_len, other, gap = closest_call(runner, greedy)
    assert gap < 2 * SHIFT  # the tiny LLaMA's two best tokens are within the shift there
    method = [*greedy[:prefix_len], other]
    divergence = judge(runner, PROMPT, method, greedy)
    assert divergence is not None and divergence.at == prefix_len
    assert divergence.noise == pytest.approx(SHIFT, rel=0.01)  # the shift's largest value
    assert divergence.rounding and divergence.tie and "a numeric tie" in divergence.describe()


def test_a_tie_keeps_the_measurement_lossless_and_a_loss_does_not(tiny_llama, monkeypatch):
    """The side by side and the trials' shared greedy judge a differing output: a tie is
    lossless (its divergence kept), a loss is not (and fails a trial, saying where)."""
    import autotune.measure.shared_greedy as shared

    prompt = EncodedPrompt("p0", PROMPT)
    for shift, lossless in ((SHIFT, True), (0.0, False)):
        runner = RoundsApart(tiny_llama, shift)
        greedy = decode_plain(runner, PROMPT, 8).tokens
        at, other, _ = closest_call(runner, greedy)
        parted = [*greedy[:at], other, *greedy[at + 1 :]]

        def speculative(runner, drafter, prompt_ids, *args, parted=parted):
            result = decode_plain(runner, prompt_ids, *args)
            result.tokens = list(parted)
            return result

        monkeypatch.setattr(timing, "decode_speculative", speculative)
        session = SideBySide(runner, {"m": lambda: None}, 8)  # type: ignore[dict-item]
        session.measure([prompt])
        measured = session.measurements["m"]
        row = measured.prompts[-1]
        assert row.lossless is lossless and row.divergence is not None
        assert row.divergence.at == at
        assert measured.lossless is lossless
        assert (measured.first_loss() is None) is lossless

        monkeypatch.setattr(shared, "decode_speculative", speculative)
        trials = SharedGreedy(8)
        if lossless:
            assert trials.method_row(runner, prompt, None).divergence.at == at  # type: ignore[arg-type,union-attr]
        else:
            with pytest.raises(LossyDecoding, match=rf"token {at} is .*not a tie"):
                trials.method_row(runner, prompt, None)  # type: ignore[arg-type]


def test_a_step_that_disagrees_by_the_logits_spread_is_a_fault_not_rounding(tiny_llama):
    """A one-token step that computes something else (here its logits shifted by more than
    their spread) would make every difference look like a tie: it is judged a loss."""
    runner = RoundsApart(tiny_llama, shift=100.0)
    greedy = decode_plain(Runner(tiny_llama), PROMPT, 4).tokens
    other, _ = runner_up(runner, [*PROMPT, *greedy[:1]], greedy[1])
    divergence = judge(runner, PROMPT, [greedy[0], other], greedy[:2])
    assert divergence is not None and divergence.noise > divergence.spread
    assert not divergence.rounding and not divergence.tie
    assert "more than rounding would" in divergence.describe()


def test_the_suites_check_takes_a_tie_and_fails_a_loss(tiny_llama, same_greedy):
    """The suites compare greedy outputs with ``same_greedy``, which judges as a profile
    does: a tie passes, a token outside the engine's rounding fails, saying so."""
    runner = RoundsApart(tiny_llama, SHIFT)
    greedy = decode_plain(runner, PROMPT, 12).tokens
    at, other, _ = closest_call(runner, greedy)
    parted = [*greedy[:at], other]
    same_greedy(runner, PROMPT, list(greedy), greedy)
    same_greedy(runner, PROMPT, parted, greedy[: at + 1])  # a tie
    plain = Runner(tiny_llama)
    greedy = decode_plain(plain, PROMPT, 12).tokens
    other, _ = runner_up(plain, [*PROMPT, *greedy[:5]], greedy[5])
    with pytest.raises(AssertionError, match="not a tie"):
        same_greedy(plain, PROMPT, [*greedy[:5], other], greedy[:6], "label")
