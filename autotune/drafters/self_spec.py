"""Draft & Verify: the target itself, with some sublayers skipped, drafts for itself."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import cast

import torch

from autotune.drafters.in_step import run_in_step
from autotune.engine.proposal import ChainDrafter, Draft, DraftContext, Drafter, VerifyResult
from autotune.engine.runner import Segment
from autotune.engine.sampling import most_probable, probabilities, sample
from autotune.engine.skip import SkipMask


@dataclass(frozen=True)
class AdaptiveExit:
    """Draft & Verify's rule for moving the exit threshold towards a target acceptance."""

    target_acceptance: float = 0.9
    step: float = 0.01
    beta1: float = 0.5
    beta2: float = 0.9


@dataclass(frozen=True)
class DraftExitPolicy:
    """Stop drafting when the draft's top-1 probability falls below ``exit_threshold``
    or after ``max_tokens``; the first draft token is always proposed."""

    max_tokens: int = 12
    exit_threshold: float = 0.8
    adaptive: AdaptiveExit | None = AdaptiveExit()


DV_DEFAULT_POLICY = DraftExitPolicy()  # Draft & Verify's published defaults


class ExitThreshold:
    """The exit threshold as a policy moves it after each verification; the drafter and
    replays of its decoding (CAPE's fit) share this one rule."""

    def __init__(self, policy: DraftExitPolicy):
        self.rule = policy.adaptive
        self.value = policy.exit_threshold
        self._acceptance_ema = 0.0 if self.rule is None else self.rule.target_acceptance

    @property
    def never_fires(self) -> bool:
        """A fixed threshold of 0, which no probability falls below: drafting runs to its
        limit, so a greedy drafter need not read each step's confidence back."""
        return self.rule is None and self.value <= 0.0

    def update(self, drafted: int, accepted: int, hit_max: bool) -> None:
        rule = self.rule
        if rule is None or drafted == 0:
            return
        self._acceptance_ema = (
            rule.beta1 * self._acceptance_ema + (1 - rule.beta1) * accepted / drafted
        )
        if self._acceptance_ema < rule.target_acceptance:
            proposal = self.value + rule.step
        elif hit_max:
            proposal = self.value
        else:
            proposal = self.value - rule.step
        self.value = rule.beta2 * self.value + (1 - rule.beta2) * proposal


class LayerSkipDrafter(ChainDrafter):
    """``ranked_width`` > 0: drafts carry each step's top tokens and probabilities."""

    def __init__(
        self, skip: SkipMask, policy: DraftExitPolicy = DV_DEFAULT_POLICY, ranked_width: int = 0
    ):
        if skip.size == 0:
            raise ValueError("a layer-skip draft must skip at least one sublayer")
        self.skip = skip
        self.policy = policy
        self.ranked_width = ranked_width
        self.max_draft_tokens = policy.max_tokens
        self.reset()

    def reset(self) -> None:
        self.exit = ExitThreshold(self.policy)
        self._hit_max = False

    @property
    def threshold(self) -> float:
        return self.exit.value

    def limit(self, context: DraftContext) -> int:
        return max(1, min(self.policy.max_tokens, context.max_tokens - 1))

    def propose(self, context: DraftContext) -> Draft:
        return self.propose_all([self], [context])[0]

    @classmethod
    def propose_all(cls, drafters: list[Drafter], contexts: list[DraftContext]) -> list[Draft]:
        """Drafts of several sequences, those with the same skip mask sharing one draft
        forward a step (``Runner.forward_batch``), each stopping by its own exit rule."""
        own = cast(list[LayerSkipDrafter], drafters)  # ``propose_all`` is called per kind

        def run(indices: list[int], segments: list[Segment]) -> list[torch.Tensor]:
            runner, skip = contexts[indices[0]].runner, own[indices[0]].skip
            return [out.logits[-1] for out in runner.forward_batch(segments, skip=skip)]

        return run_in_step(
            [d._drafting(c) for d, c in zip(own, contexts)],
            key=lambda i: (id(contexts[i].runner), own[i].skip),
            run=run,
        )

    def _drafting(self, context: DraftContext) -> Generator[Segment, torch.Tensor, Draft]:
        """One proposal: yields each draft step's token, is sent its logits."""
        device = context.runner.input_device
        limit = self.limit(context)
        if context.sampling.greedy and self.exit.never_fires:
            return (yield from self._drafting_to_the_limit(context, limit))
        token, tokens, dists = context.last_token, [], []
        for i in range(limit):
            position = torch.tensor([context.position + i], device=device)
            logits = yield Segment(torch.tensor([token], device=device), position, context.cache)
            if context.sampling.greedy:
                probs = torch.softmax(logits, dim=-1)
                confidence, token = most_probable(probs)
            else:
                probs = probabilities(logits, context.sampling)
                confidence = float(probs.max())
                token = sample(probs, context.generator)
            if i > 0 and confidence < self.threshold:
                break
            tokens.append(token)
            dists.append(probs)
        return self._draft(tokens, dists, limit, context.sampling.greedy)

    def _drafting_to_the_limit(
        self, context: DraftContext, limit: int
    ) -> Generator[Segment, torch.Tensor, Draft]:
        """A greedy proposal no exit can cut short: each step's token goes to the next
        step on the device, and the chain is read back once, when it is complete."""
        device = context.runner.input_device
        token = torch.tensor([context.last_token], device=device)
        picked, dists = [], []
        for i in range(limit):
            position = torch.tensor([context.position + i], device=device)
            probs = torch.softmax((yield Segment(token, position, context.cache)), dim=-1)
            token = probs.argmax(dim=-1, keepdim=True)  # the first of equals, as on the host
            picked.append(token)
            dists.append(probs)
        return self._draft(torch.cat(picked).tolist(), dists, limit, greedy=True)

    def _draft(
        self, tokens: list[int], dists: list[torch.Tensor], limit: int, greedy: bool
    ) -> Draft:
        """The proposal of ``tokens`` drafted from ``dists``, at most ``limit`` of them."""
        self._hit_max = len(tokens) == limit
        draft = Draft(tokens=tokens, draft_probs=None if greedy else torch.stack(dists))
        if self.ranked_width:
            ranked = torch.stack(dists).topk(self.ranked_width, dim=-1)
            draft.ranked_tokens, draft.ranked_probs = ranked.indices, ranked.values
        return draft

    def observe(self, result: VerifyResult) -> None:
        self.exit.update(result.num_drafted, result.num_accepted, self._hit_max)
