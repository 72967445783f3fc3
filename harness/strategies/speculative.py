"""Speculative-decoding cases (contract: harness/contracts/speculative.py): small exact models from a drawn seed."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from llm_inference_harness.strategies.common import generator, seeds


def probability_table(V: int, order: int, zeros: float, g: torch.Generator) -> torch.Tensor:
    """(V+1,)*order + (V,) float64 rows with arbitrary values, a share `zeros` of them exactly 0 (never a
    whole row), each row summing to one."""
    shape = (*(V + 1,) * order, V)
    t = torch.rand(shape, generator=g, dtype=torch.float64) ** 3  # skewed: tiny and large probabilities
    t[torch.rand(shape, generator=g, dtype=torch.float64) < zeros] = 0.0
    keep = torch.randint(V, (*shape[:-1], 1), generator=g)  # one entry per row stays positive
    t.scatter_(-1, keep, t.gather(-1, keep) + 0.05)
    return t / t.sum(-1, keepdim=True)


SMALL_INTS = 257  # CPython keeps one object for each int in -5..256: below this `is` agrees with `==` by chance


def past_small_ints(seed: int, V: int = 320):
    """A context-free model whose every probable token has an id past 256, as most ids of a real vocabulary (32k or
    more) do: two equal ids there are two int objects, so a token compared with `is` instead of `==` differs."""
    from llm_inference_harness.sampling.lm import TableLM

    t = probability_table(V, 0, 0.0, generator(seed))  # (V,)
    t[:SMALL_INTS] = 0.0
    return TableLM(t / t.sum())


@dataclass(frozen=True)
class SpeculativeCase:
    V: int
    target_order: int
    draft: str  # "table", "target" (the draft is the target), "uniform", or "point" (one-hot rows)
    draft_order: int
    zeros: float  # share of table entries that are exactly zero
    gamma: int
    T: int
    prompt: tuple[int, ...]
    eos: int | None
    seed: int

    def models(self):
        from llm_inference_harness.sampling.lm import TableLM

        g = generator(self.seed)
        target = TableLM(probability_table(self.V, self.target_order, self.zeros, g))
        if self.draft == "target":
            return target, target
        table = probability_table(self.V, self.draft_order, self.zeros, g)
        if self.draft == "uniform":
            table = torch.full_like(table, 1.0 / self.V)
        elif self.draft == "point":
            table = torch.nn.functional.one_hot(table.argmax(-1), self.V).double()
        return target, TableLM(table)

    def situations(self) -> list[str]:
        """The situations bugs hide in that this case reaches, for `hypothesis.event` (the statistics count
        them): a round of >= 2 drafts from a draft whose rows depend on the context (a q read at the wrong
        position, a residual from the wrong row, one uniform for all tests), eos generated (the output
        stops), eos drafted before a round's last draft (an accepted eos must end the round)."""
        drafts = min(self.gamma, self.T - 1)  # the first round's
        target, draft = self.models()
        found = []
        if drafts >= 2 and self.draft in ("table", "point") and self.draft_order >= 1:
            found.append("a round of >= 2 drafts from a context-dependent draft")
        if self.eos is not None and bool((target.table[..., self.eos] > 0).any()):
            found.append("eos can be generated")
            if drafts >= 2 and bool((draft.table[..., self.eos] > 0).any()):
                found.append("eos can be drafted before a round's last draft")
        return found


@st.composite
def speculative_cases(draw: st.DrawFn, max_gamma: int = 4, max_T: int = 4, width: int = 1,
                      max_V: int = 6) -> SpeculativeCase:
    """`width` draft chains per round (multi-draft samplers): gamma is capped so that the V^(width gamma) draft
    trees of a round stay <= 256 and one enumeration stays under a second.  Targets of order 3 (V <= 4) see
    further back than a verify window of gamma + 1 = 2 tokens.  Half the cases (where max_gamma >= 2 and
    max_T >= 3) draft >= 2 tokens in their first round from a draft of order >= 1 (table or point rows), and
    eos is one of the V tokens in V of V + 1 cases; `SpeculativeCase.situations` names what a case reaches."""
    V = draw(st.integers(2, max_V))
    T_max = min(max_T, 3 if V > 4 else 4)  # at most 6^3 output sequences: enumeration < 1 s
    if width > 1:  # and one round and a bit: a second round of V^(width gamma) trees per first-round outcome
        max_gamma = max(1, min(max_gamma, int(math.log(256) / (width * math.log(V)))))
        T_max = min(T_max, 3)
    if max_gamma >= 2 and T_max >= 3 and draw(st.booleans()):  # context-dependent drafts, >= 2 a round
        gamma, T = draw(st.integers(2, max_gamma)), draw(st.integers(3, T_max))
        draft, draft_order = draw(st.sampled_from(["table", "point"])), draw(st.integers(1, 2))
    else:
        gamma, T = draw(st.integers(1, max_gamma)), draw(st.integers(1, T_max))
        draft = draw(st.sampled_from(["table", "target", "uniform", "point"]))
        draft_order = draw(st.integers(0, 2))
    return SpeculativeCase(
        V=V, target_order=draw(st.integers(0, 3 if V <= 4 else 2)), draft=draft, draft_order=draft_order,
        zeros=draw(st.sampled_from([0.0, 0.3, 0.6])), gamma=gamma, T=T,
        prompt=tuple(draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=3))),
        eos=draw(st.sampled_from([None, *range(V)])), seed=draw(seeds),
    )


@dataclass(frozen=True)
class ContextFreePair:
    """Context-free target p and draft q (order-0 tables): acceptance a = sum(min(p, q)) every round."""

    V: int
    zeros: float
    gamma: int
    seed: int

    def models(self):
        from llm_inference_harness.sampling.lm import TableLM

        g = generator(self.seed)
        p, q = (probability_table(self.V, 0, self.zeros, g) for _ in range(2))
        return TableLM(p), TableLM(q)


@st.composite
def context_free_pairs(draw: st.DrawFn) -> ContextFreePair:
    gamma = draw(st.integers(1, 4))
    V = draw(st.integers(2, {1: 6, 2: 6, 3: 5, 4: 4}[gamma]))  # at most 5^3 draft sequences per round
    return ContextFreePair(V=V, zeros=draw(st.sampled_from([0.0, 0.3])), gamma=gamma, seed=draw(seeds))
