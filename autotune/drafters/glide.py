"""GLIDE drafting: a small decoder that reads the target's KV cache drafts a chain.

The target's cache at a proposal holds every committed token but the root (the last
token, the bonus of the last verification): the draft reads it as it stands, a little
stale, and never waits for the root's keys. Each proposal first runs the draft over the
tokens committed since the last one (its own KV cache then holds every committed token,
the root included), then drafts one token a step, each step reading the same target
cache. Drafting ends after ``max_tokens`` or at the first later step whose confidence (top-1
probability) is below the exit threshold, as the layer-skip drafter's rule does (that
step's forward is spent).

Which target positions a draft row sees is one rule, so that a proposal depends only on
the committed tokens: row i sees the target's positions below min(i, p) for a root at p
(and always position 0). Measurement (``measure.glide_accuracy``) replays exactly this.

Drafting is written as a generator of draft-model calls (``drafters.in_step``): sequences
decoded together share each step's draft forward and projection (``propose_all``). Where
the target runs a fixed-shape step (``runner.static``: on a GPU), those forwards run in
the draft's own (``heads.static_glide``), its cache lent in its target cache's lane; the
exit rule reads each step's confidence on the host, between steps, and a greedy chain no
exit cuts short is one step after the commit (``heads.glide_chain``).
"""

from __future__ import annotations

import itertools
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import torch

from autotune.drafters.in_step import InStepDrafter, run_by_kind
from autotune.drafters.self_spec import DraftExitPolicy, ExitThreshold
from autotune.engine.kvcache import KVCache
from autotune.engine.proposal import Draft, DraftContext, VerifyResult
from autotune.engine.sampling import most_probable, probabilities, sample
from autotune.engine.staging import sent
from autotune.engine.static_cache import StaticCache
from autotune.heads.eagle import DraftProjection
from autotune.heads.glide import GlideDraft, GlideRows, stale_visibility
from autotune.heads.glide_chain import ChainCall, ChainSteps
from autotune.heads.static_glide import GlideStep, kept


@dataclass
class _ChainCall:
    """A greedy chain of ``length`` tokens drafted in one step (``heads.glide_chain``),
    from ``call.logits``: the commit call's draft logits."""

    call: ChainCall
    steps: ChainSteps
    length: int


class GlideDrafter(InStepDrafter):
    """``projection``: the lm_head over a draft vocabulary (default: the draft's whole
    lm_head, the target's when shared). ``ranked_width`` > 0: drafts carry each step's
    top tokens and probabilities (for CAPE)."""

    def __init__(
        self,
        draft: GlideDraft,
        policy: DraftExitPolicy,
        projection: DraftProjection | None = None,
        ranked_width: int = 0,
    ):
        self.draft, self.policy, self.projection = draft, policy, projection
        self.ranked_width = ranked_width
        self.max_draft_tokens = policy.max_tokens
        self.reset()

    def reset(self) -> None:
        self.cache: KVCache | None = None
        self.step: GlideStep | None = None  # the draft's fixed-shape step, where it runs
        self.chains: ChainSteps | None = None  # a greedy chain in one step, there
        self.committed = 0  # positions in the draft's cache that the target confirmed
        self.exit = ExitThreshold(self.policy)
        self._hit_max = False

    @property
    def model(self) -> GlideDraft:
        return self.draft

    def projection_for(self, runner) -> DraftProjection:
        if self.projection is None:
            self.projection = DraftProjection(self.draft.vocabulary(runner)[1])
        return self.projection

    @staticmethod
    def run_together(
        model: GlideDraft, projection: DraftProjection, calls: list[GlideRows | _ChainCall]
    ) -> list:
        """Several sequences' calls: their chains in one step, first (they copy their first
        logits in before the draft's step runs again), and their rows as one draft
        forward."""
        return run_by_kind(
            calls,
            [
                (_ChainCall, lambda chains: GlideDrafter._chains(projection, chains)),
                (GlideRows, lambda rows: GlideDrafter._rows(model, projection, rows)),
            ],
        )

    @staticmethod
    def _chains(projection: DraftProjection, calls: list[_ChainCall]) -> list:
        """Each chain's tokens and distributions, drafted together in their step; where it
        refuses them (another length, a cache off the step, a refused recording), copies
        of their first logits, from which the drafter runs the chain a call a step: a
        call in the same round may overwrite the step's output they are views of."""
        first = calls[0]
        if all(call.steps is first.steps and call.length == first.length for call in calls):
            drafted = first.steps.draft([c.call for c in calls], first.length, projection)
            if drafted is not None:
                return drafted
        return [call.call.logits.clone() for call in calls]

    @staticmethod
    def _rows(
        model: GlideDraft, projection: DraftProjection, calls: list[GlideRows]
    ) -> list[torch.Tensor]:
        """Several sequences' rows as one draft forward; the draft logits of each one's
        last row through one projection. In the draft's fixed-shape step where they fit
        it (``GlideStep.place``: their caches lent by it and by the target's step), else
        eagerly."""
        step = kept(model)
        fixed = None if step is None else step.forward(calls, projection)
        if fixed is not None:
            return fixed
        hidden = model.forward_rows(calls)
        ends = list(itertools.accumulate(call.positions.shape[0] for call in calls))
        return list(projection(hidden[[end - 1 for end in ends]]))

    def drafting(self, context: DraftContext) -> Generator[GlideRows | _ChainCall, Any, Draft]:
        """Yields the rows of each draft forward, is sent the draft logits of their last
        row (or yields a chain in one step, ``_to_the_limit``), returns the chain."""
        runner = context.runner
        embed, _ = self.draft.vocabulary(runner)
        limit = max(1, min(self.policy.max_tokens, context.max_tokens - 1))
        target_kv = self.draft.read_target(context.cache, context.position)
        logits = yield self._commit(context, embed, target_kv)
        if context.sampling.greedy and self.exit.never_fires:
            return (yield from self._to_the_limit(context, embed, target_kv, logits, limit))
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        for step in range(limit):
            if step > 0:  # the previous token, one position on, same target cache
                ids = sent([tokens[-1]], runner.device)
                logits = yield self._step_rows(context, embed(ids), target_kv, step)
            token, probs, confidence = self._pick(logits, context)
            if step > 0 and confidence < self.exit.value:
                break
            tokens.append(token)
            dists.append(probs)
        self._hit_max = len(tokens) == limit
        return self._draft(tokens, torch.stack(dists), context)

    def _to_the_limit(
        self, context: DraftContext, embed, target_kv, logits: torch.Tensor, limit: int
    ) -> Generator[GlideRows | _ChainCall, Any, Draft]:
        """A greedy chain no exit can cut short, from the first step's draft ``logits``:
        each step's token goes to the next on the device, and the chain is read back once,
        when it is complete. Where the draft runs in its step, the chain is one step more
        (``heads.glide_chain``)."""
        assert self.projection is not None
        self._hit_max = True
        if self.chains is not None and self.cache is not None and limit > 1:
            call = ChainCall(self.cache, context.cache, context.position, context.position, logits)
            drafted = yield _ChainCall(call, self.chains, limit)
            if isinstance(drafted, tuple):
                tokens, probs = drafted
                return self._draft(tokens, probs, context)
            logits = drafted  # refused: a call a step, from the first logits' copy
        picked: list[torch.Tensor] = []
        dists: list[torch.Tensor] = []
        for step in range(limit):
            if step > 0:
                logits = yield self._step_rows(context, embed(picked[-1]), target_kv, step)
            probs = logits.float().softmax(-1)
            picked.append(self.projection.tokens(probs.argmax(-1, keepdim=True)))
            dists.append(probs)
        return self._draft(torch.cat(picked).tolist(), torch.stack(dists), context)

    def _step_rows(self, context: DraftContext, embeds: torch.Tensor, target_kv, step: int):
        """The row of draft step ``step`` > 0: the previous token's embedding, one position
        on, reading the same target cache."""
        position = torch.tensor([context.position + step], device=context.runner.input_device)
        assert self.cache is not None
        return GlideRows(embeds, position, target_kv, self.cache, target=context.cache)

    def observe(self, result: VerifyResult) -> None:
        self.exit.update(result.num_drafted, result.num_accepted, self._hit_max)

    def _commit(self, context: DraftContext, embed, target_kv) -> GlideRows:
        """The rows of the tokens committed since the last proposal, root last (the last
        row drafts the first token)."""
        runner, position = context.runner, context.position
        if self.cache is None or self.committed > position:
            self.cache = self._new_cache(context, position + context.max_tokens + 64)
            self.committed = 0
        self.cache.crop(self.committed)  # drafted entries of the last proposal
        new = context.history[self.committed : position + 1]
        if len(new) != position + 1 - self.committed:
            raise RuntimeError("GLIDE drafting needs the whole token history")
        positions = torch.arange(self.committed, position + 1, device=runner.input_device)
        cross = stale_visibility(positions.clamp(max=position), position)
        self.committed = position + 1
        ids = sent(new, runner.device)
        return GlideRows(embed(ids), positions, target_kv, self.cache, cross, target=context.cache)

    def _new_cache(self, context: DraftContext, capacity: int) -> KVCache:
        """The draft's cache: lent by the draft's fixed-shape step, in the lane of the
        target's cache, where the target's step lent that cache (``runner.static``: on a
        GPU); else its own."""
        static, target = context.runner.static, context.cache
        self.step = self.chains = None
        if static is not None and isinstance(target, StaticCache) and static.storage.holds(target):
            self.step = GlideStep.of(self.draft, static)
            if self.step is not None:
                embed, _ = self.draft.vocabulary(context.runner)
                self.chains = ChainSteps.of(self.step, embed)
                return self.step.lend(capacity, target.lane)
        return self.draft.new_cache(capacity)

    def _pick(self, logits: torch.Tensor, context: DraftContext) -> tuple[int, torch.Tensor, float]:
        """The step's token, its distribution over the draft vocabulary and the largest
        probability in it (the exit rule's confidence), from the draft logits [V'] of its
        last row: greedy, one read back to the host."""
        assert self.projection is not None
        logits = logits.float()
        if context.sampling.greedy:
            probs = logits.softmax(-1)
            confidence, index = most_probable(probs)
        else:
            probs = probabilities(logits, context.sampling)
            index = sample(probs, context.generator)
            confidence = float(probs.max())
        return self.projection.token_of(index), probs, confidence

    def _draft(self, tokens: list[int], stacked: torch.Tensor, context: DraftContext) -> Draft:
        """The draft of ``tokens``, with their distributions over the draft vocabulary
        ``stacked`` [k, V'] where sampling or CAPE needs them."""
        assert self.projection is not None
        draft = Draft(tokens=tokens)
        if not context.sampling.greedy:
            draft.draft_probs = self._full_vocabulary(stacked, context)
        if self.ranked_width:
            ranked = stacked.topk(min(self.ranked_width, stacked.shape[-1]), dim=-1)
            draft.ranked_tokens = self.projection.tokens(ranked.indices)
            draft.ranked_probs = ranked.values
        return draft

    def _full_vocabulary(self, probs: torch.Tensor, context: DraftContext) -> torch.Tensor:
        """[k, V] over the target's vocabulary: what speculative sampling compares."""
        assert self.projection is not None
        if self.projection.ids is None:
            return probs
        full = probs.new_zeros(len(probs), context.runner.config.vocab_size)
        full[:, self.projection.ids] = probs
        return full
