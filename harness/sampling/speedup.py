"""Speculative decoding's expected gains (Leviathan et al. 2023, section 3).

With acceptance rate a = sum_x min(p(x), q(x)) (the same every round), gamma draft tokens per round and a
draft step costing c target steps:

    tokens per target call  E = (1 - a^(gamma+1)) / (1 - a) = 1 + a + ... + a^gamma     (their eq. 1)
    speedup                 E / (1 + gamma c)                                            (their Thm 3.8)

Theorem 3.8 assumes the target scores gamma + 1 positions in the time of one decode step, true where a
step is bound by reading the weights (a GPU).  Where it is not, `verify` = time of the (gamma + 1)-position
call / time of a one-position step enters the denominator: E / (verify + gamma c).
"""

from __future__ import annotations

import torch


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> float:
    """Mean over rows of sum(min(p, q)): 1 - the total variation distance between p and q."""
    return float(torch.minimum(p, q).sum(-1).mean())


def tokens_per_call(a: float, gamma: int) -> float:
    """1 + a + ... + a^gamma: equal to (1 - a^(gamma+1)) / (1 - a) and finite at a = 1."""
    return sum(a**i for i in range(gamma + 1))


def speedup(a: float, gamma: int, c: float, verify: float = 1.0) -> float:
    return tokens_per_call(a, gamma) / (verify + gamma * c)


def best_gamma(a: float, c: float, max_gamma: int = 64) -> tuple[int, float]:
    """The gamma in 1..max_gamma with the largest expected speedup, and that speedup."""
    return max(((g, speedup(a, g, c)) for g in range(1, max_gamma + 1)), key=lambda gs: gs[1])


if __name__ == "__main__":
    import sys

    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python -m llm_inference_harness.sampling.speedup ALPHA C [VERIFY]  "
                 "(acceptance rate in [0, 1], draft cost > 0)")
    a, c = float(sys.argv[1]), float(sys.argv[2])
    verify = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0  # a verify call's cost in one-token steps
    if not 0 <= a <= 1:
        sys.exit(f"ALPHA is an acceptance rate, in [0, 1]; got {a}")
    if not (c > 0 and verify > 0):
        sys.exit(f"C (a draft step's cost) and VERIFY must be > 0; got {c} and {verify}")
    for g in range(1, 11):
        print(f"gamma={g:2d}  tokens/call={tokens_per_call(a, g):.2f}  speedup={speedup(a, g, c, verify):.2f}x")
    if verify == 1.0:
        g, s = best_gamma(a, c)
        print(f"best gamma {g}: {s:.2f}x")
