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


def second_best_after(runner: Runner, prefix: list[int]) -> tuple[int, float]:
    """The runner's second most likely token after ``prefix``, and its logit's distance
    from the best."""
    cache = runner.new_cache(capacity=len(prefix) + 8)
    out = runner.forward(torch.tensor(prefix), torch.arange(len(prefix)), cache, last_only=True)
    top = out.logits[-1].float().topk(2)
    return int(top.indices[1]), float(top.values[0] - top.values[1])


def test_the_first_difference_and_outputs_cut_apart():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 4, 5], [1, 2, 3, 5]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_the_same_output_is_no_divergence(tiny_llama):
    runner = Runner(tiny_llama)
    greedy = decode_plain(runner, PROMPT, 12).tokens
    assert judge(runner, PROMPT, list(greedy), greedy) is None


def test_on_the_cpu_any_other_token_is_a_loss(tiny_llama):
    """Here a whole-prefix forward and a one-token step agree, so no gap is within
    rounding: a token that is not the argmax changed the output."""
    runner = Runner(tiny_llama)
    greedy = decode_plain(runner, PROMPT, 12).tokens
    other, gap = second_best_after(runner, [*PROMPT, *greedy[:5]])
    method = [*greedy[:5], other, *greedy[6:]]
    divergence = judge(runner, PROMPT, method, greedy)
    assert divergence is not None and divergence.at == 5
    assert (divergence.method_token, divergence.greedy_token) == (other, greedy[5])
    assert divergence.gap == pytest.approx(gap, rel=1e-4) and divergence.gap > 0
    assert divergence.noise < 1e-4
    assert not divergence.tie
    assert "not a tie" in divergence.describe()


def test_where_steps_round_otherwise_a_close_second_token_is_a_tie(tiny_llama):
    runner = RoundsApart(tiny_llama, shift=5.0)
    prefix_len = 3
    greedy = decode_plain(runner, PROMPT, 12).tokens
    other, gap = second_best_after(runner, [*PROMPT, *greedy[:prefix_len]])
    assert gap < 5.0  # the tiny LLaMA's two best tokens are well within the shift
    method = [*greedy[:prefix_len], other]
    divergence = judge(runner, PROMPT, method, greedy)
    assert divergence is not None and divergence.at == prefix_len
    assert divergence.noise == pytest.approx(5.0, rel=0.01)  # the shift's largest value
    assert divergence.tie and "a numeric tie" in divergence.describe()


def test_a_tie_keeps_the_measurement_lossless_and_a_loss_does_not(tiny_llama, monkeypatch):
    """The side by side and the trials' shared greedy judge a differing output: a tie is
    lossless (its divergence kept), a loss is not (and fails a trial, saying where)."""
    import autotune.measure.shared_greedy as shared

    prompt = EncodedPrompt("p0", PROMPT)
    for shift, lossless in ((5.0, True), (0.0, False)):
        runner = RoundsApart(tiny_llama, shift)
        greedy = decode_plain(runner, PROMPT, 8).tokens
        other, _ = second_best_after(runner, [*PROMPT, *greedy[:2]])
        parted = [*greedy[:2], other, *greedy[3:]]

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
        assert row.divergence.at == 2
        assert measured.lossless is lossless
        assert (measured.first_loss() is None) is lossless

        monkeypatch.setattr(shared, "decode_speculative", speculative)
        trials = SharedGreedy(8)
        if lossless:
            assert trials.method_row(runner, prompt, None).divergence.at == 2  # type: ignore[arg-type,union-attr]
        else:
            with pytest.raises(LossyDecoding, match=r"token 2 is .*not a tie"):
                trials.method_row(runner, prompt, None)  # type: ignore[arg-type]
