"""A workload of known cost, to validate `llm_inference_harness.bench.compare`: ``work`` runs ``round(REPS * COST)``
identical steps of small attention (a GEMM, a softmax, a GEMM) on the same input, so a copy of the repository with COST
= 1.10 costs 10% more per call, to within one step.  (Feeding each step's output to the next would not do: the rows
converge, and the first steps, whose softmax underflows, cost twice the later ones.)
`llm_inference_harness.bench.compare.power` makes such copies and counts how often a comparison calls them slower;
benchmarks/bench_harness.py times ``work`` as asv would.
"""

import torch

COST = 1.0  # the copies made by llm_inference_harness.bench.compare.power raise this by the fraction they test
REPS = 200  # steps at COST 1.0: ~5 ms a call on one core


def inputs(n: int = 64, d: int = 64) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(0))  # (n, d)


def work(x: torch.Tensor) -> torch.Tensor:
    scale = x.shape[-1] ** -0.5
    for _ in range(round(REPS * COST)):
        y = torch.softmax(x @ x.T * scale, dim=-1) @ x  # (n, n) scores, then (n, d)
    return y
