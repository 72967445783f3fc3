"""Backward cases (contract: harness/contracts/attention_backward.py): output gradients and fully masked rows."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from llm_inference_harness.strategies.attention import ARGUMENTS, AttentionCase, attention_cases
from llm_inference_harness.strategies.common import generator


def output_grad(case: AttentionCase) -> torch.Tensor:
    """dO for a backward case, in q's shape/dtype/device and its own layout: a fixed function of the case's seed, so a
    printed counterexample regenerates it."""
    g = generator(case.seed ^ 0x5EED)
    return case.laid_out(torch.randn(case.B, case.H, case.Nq, case.width, generator=g, dtype=torch.float64), "do")


@st.composite
def fully_masked_cases(draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), devices: tuple[str, ...] = ("cpu",),
                       max_len: int = 120) -> AttentionCase:
    """Causal cases with Nq > Nk: the first Nq - Nk query rows see no key at all."""
    case = draw(attention_cases(dtypes=dtypes, devices=devices, max_len=max_len - 1, causal=True, arguments=ARGUMENTS))
    extra = draw(st.integers(1, max_len - case.Nk))
    return AttentionCase(**{**case.__dict__, "Nq": case.Nk + extra})
