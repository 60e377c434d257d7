"""The selection race (``measure.race``): the clearly slower drop out and decode no more,
the close stay in, and the looks are allowed for."""

from __future__ import annotations

import random

from autotune.measure.race import against, race
from autotune.measure.timing import EncodedPrompt, Measurement, PromptMeasurement


class FakeSession:
    """Stands for ``SideBySide``: each candidate decodes at its own speed over greedy,
    with a prompt's difficulty shared by all and a little noise of its own."""

    def __init__(self, speedups: dict[str, float], noise: float = 0.03, seed: int = 0):
        self.speedups = speedups
        self.variants = dict.fromkeys(speedups)
        self.measurements = {name: Measurement() for name in speedups}
        self.decoded: dict[str, int] = dict.fromkeys(speedups, 0)
        self.noise, self.rng = noise, random.Random(seed)

    def measure(self, prompts, on_prompt=None, until=None, least=0) -> int:
        for prompt in prompts:
            greedy = 4.0 * (1 + self.rng.random())
            for name in self.variants:
                seconds = greedy / self.speedups[name] * (1 + self.rng.uniform(-1, 1) * self.noise)
                self.measurements[name].prompts.append(
                    PromptMeasurement(prompt.id, 64, greedy, 64, seconds, 30, 60, 34, True)
                )
                self.decoded[name] += 1
        return len(prompts)

    def drop(self, name: str) -> None:
        del self.variants[name]


def prompts(count: int) -> list[EncodedPrompt]:
    return [EncodedPrompt(f"p{i}", [1, 2, 3]) for i in range(count)]


def test_the_clearly_slower_drop_out_and_decode_no_more():
    session = FakeSession({"ngram": 1.35, "medusa": 1.30, "eagle": 1.0}, noise=0.08)
    result = race(session, prompts(12), bound=1.0)  # type: ignore[arg-type]
    assert result.alive == ["ngram"] and result.stopped == "decided"
    assert set(result.dropped) == {"medusa", "eagle"}
    assert "of ngram's speed" in result.dropped["medusa"]
    # eagle dropped at the first look, medusa at the second, and the race ended there
    assert session.decoded == {"ngram": 8, "medusa": 8, "eagle": 6}


def test_candidates_too_close_to_tell_both_stay():
    session = FakeSession({"a": 1.30, "b": 1.29}, noise=0.08)
    result = race(session, prompts(10), bound=1.0)  # type: ignore[arg-type]
    assert sorted(result.alive) == ["a", "b"] and result.stopped == "prompts"
    assert result.looks == 3  # after 6, 8 and 10 prompts
    assert all(m.looks == 3 for m in session.measurements.values())


def test_a_candidate_clearly_slower_than_greedy_is_dropped_even_alone():
    session = FakeSession({"self_spec": 0.7})
    result = race(session, prompts(10), bound=1.0)  # type: ignore[arg-type]
    assert result.alive == [] and result.stopped == "none left"
    assert "over greedy, below 1.00" in result.dropped["self_spec"]


def test_against_pairs_a_candidate_with_the_leader_prompt_by_prompt():
    def rows(seconds: list[float]) -> Measurement:
        return Measurement(
            [
                PromptMeasurement(f"p{i}", 64, 8.0, 64, s, 30, 60, 34, True)
                for i, s in enumerate(seconds)
            ]
        )

    pairs = against(rows([2.0, 4.0, 6.0]), rows([1.0, 2.0]))  # p2: the leader never decoded it
    assert len(pairs) == 2 and abs(pairs.speedup() - 0.5) < 1e-9


def test_no_one_leaves_on_fewer_prompts_than_an_interval_needs():
    session = FakeSession({"ngram": 1.4, "self_spec": 0.5})
    result = race(session, prompts(4), bound=1.0)  # type: ignore[arg-type]
    assert sorted(result.alive) == ["ngram", "self_spec"] and result.stopped == "prompts"


def test_a_race_out_of_time_decodes_one_prompt_not_an_intervals_least():
    from autotune.budget import Budget

    class Timed(FakeSession):
        def measure(self, prompts, on_prompt=None, until=None, least=0) -> int:
            if until is not None and until.spent():  # as SideBySide: the least, no more
                prompts = prompts[:least]
            return super().measure(prompts, on_prompt, until, least)

    session = Timed({"a": 1.3, "b": 1.0})
    result = race(session, prompts(12), bound=1.0, budget=Budget(0.0))  # type: ignore[arg-type]
    assert session.decoded == {"a": 1, "b": 1} and result.stopped == "time"
