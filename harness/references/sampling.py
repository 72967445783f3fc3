"""The sampling contract's float64 oracle (harness/contracts/sampling.py), and what earns its tolerances.

`processed` is the processed distribution; `kept` the set of tokens it keeps, computed row by row from the
contract's definitions (ranks and masses by pairwise comparison, no sort, so it shares no code path with a
sort-based implementation); `distribution` the softmax over a given kept set.  Two allowances follow the
implementation's dtype: `plain` is that softmax computed in the dtype in two operation orders (the earned
bound of harness/engine/tolerance.py), and `threshold_slack` the width within which a keep-or-drop comparison is a
matter of rounding: ``kept(..., slack=-s)`` is what every implementation must keep, ``kept(..., slack=s)`` what
it may keep.
"""

from __future__ import annotations

import torch

from llm_inference_harness.contracts.sampling import ORDERS, SamplingParams
from llm_inference_harness.engine.tolerance import EPS, TOLERANCES

TINY = 1e-30  # probabilities below this are not compared relatively: float32's exp underflows near 1e-38


def penalized(logits: torch.Tensor, params: SamplingParams, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(B, V) logits in ``dtype`` after the repetition penalty (prompt and output ids) and the frequency and
    presence penalties (output ids)."""
    out = logits.to(dtype).clone()  # (B, V)
    for b in range(out.shape[0]):
        seen = sorted(set(params.prompt_tokens[b]) | set(params.output_tokens[b]))
        r = params.repetition_penalty[b]
        if seen and r != 1.0:
            x = out[b, seen]
            out[b, seen] = torch.where(x > 0, x / r, x * r)
        counts = torch.zeros(out.shape[1], dtype=dtype)
        for t in params.output_tokens[b]:
            counts[t] += 1
        out[b] -= params.frequency_penalty[b] * counts + params.presence_penalty[b] * (counts > 0).to(dtype)
    return out


def before(x: torch.Tensor, keep: torch.Tensor, ties: str) -> torch.Tensor:
    """(V, V) bool: [i, j] when token i is kept and ranks before token j (higher value; on a tie, under
    ``ties="index"``, the lower id)."""
    ahead = x[:, None] > x[None, :]  # (V, V)
    if ties == "index":
        ids = torch.arange(len(x))
        ahead |= (x[:, None] == x[None, :]) & (ids[:, None] < ids[None, :])
    return ahead & keep[:, None]


def softmax_over(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.masked_fill(~keep, -torch.inf), dim=-1)


def kept_row(z: torch.Tensor, b: int, params: SamplingParams, order: str, ties: str, slack: float) -> torch.Tensor:
    """(V,) bool: the tokens row b keeps, from its penalized logits ``z`` (V,) float64."""
    keep = z > -torch.inf
    first = torch.zeros_like(keep)
    first[int(z.argmax())] = True  # the first of the ranking, kept by every filter (min_tokens_to_keep = 1)
    T = params.temperature[b]
    if T == 0:
        return first
    x = z
    for stage in ORDERS[order]:
        if stage == "temperature":
            x = z / T
        elif stage == "top_k" and params.top_k[b] > 0:
            keep &= (before(x, keep, ties).sum(0) < params.top_k[b]) | first
        elif stage == "top_p" and params.top_p[b] < 1:
            q = softmax_over(x, keep)
            mass = (before(x, keep, ties).double() * q[:, None]).sum(0)  # (V,) mass ranked before each token
            keep &= (mass < params.top_p[b] + slack) | first
        elif stage == "min_p" and params.min_p[b] > 0:
            q = softmax_over(x, keep)
            keep &= (q >= (params.min_p[b] - slack) * q.max()) | first
    return keep


def kept(logits: torch.Tensor, params: SamplingParams, *, order: str, ties: str, slack: float = 0.0) -> torch.Tensor:
    """(B, V) bool: the kept tokens; ``slack`` > 0 keeps what a threshold within slack of it keeps, < 0 drops it."""
    z = penalized(logits, params)  # (B, V)
    rows = [kept_row(z[b], b, params, order, ties, slack) for b in range(z.shape[0])]
    return torch.stack(rows) if rows else torch.zeros(z.shape, dtype=torch.bool)


def distribution(logits: torch.Tensor, params: SamplingParams, keep: torch.Tensor,
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(B, V): softmax(z / T) over the kept tokens (one-hot on a greedy row's kept token), computed in ``dtype``."""
    z = penalized(logits, params, dtype)  # (B, V)
    T = torch.tensor(params.temperature, dtype=dtype)[:, None]  # (B, 1)
    p = torch.softmax((z / torch.where(T > 0, T, 1)).masked_fill(~keep, -torch.inf), dim=-1)
    return torch.where(T > 0, p, keep.to(dtype))


def processed(logits: torch.Tensor, params: SamplingParams, *, order: str = "transformers",
              ties: str = "keep") -> torch.Tensor:
    """(B, V) float64: the processed distribution of every row."""
    return distribution(logits, params, kept(logits, params, order=order, ties=ties))


def plain(logits: torch.Tensor, params: SamplingParams, keep: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    """The processed distribution over ``keep`` computed in ``dtype`` itself, in two operation orders: softmax,
    and exp(x - max) / sum written out (the earned bound's yardstick)."""
    z = penalized(logits, params, dtype)  # (B, V)
    T = torch.tensor(params.temperature, dtype=dtype)[:, None]  # (B, 1)
    x = (z / torch.where(T > 0, T, 1)).masked_fill(~keep, -torch.inf)  # (B, V)
    e = torch.exp(x - x.max(-1, keepdim=True).values)  # (B, V)
    return [torch.where(T > 0, p, keep.to(dtype)) for p in (torch.softmax(x, -1), e / e.sum(-1, keepdim=True))]


def threshold_slack(logits: torch.Tensor, params: SamplingParams, dtype: torch.dtype) -> float:
    """How close to its threshold a top-p mass or a min-p ratio may be and still go either way in ``dtype``:
    k times the largest relative error of the dtype's own softmax (tempered and untempered, over the tokens a
    filter sees), twice over for a renormalized mass, plus V ulps for a mass summed over V tokens and the
    table's floor."""
    tol, eps = TOLERANCES[("forward", dtype)], EPS[dtype]
    sampled = torch.tensor(params.temperature) > 0
    if not bool(sampled.any()):
        return 0.0
    V = logits.shape[1]
    worst = 0.0
    for T in (torch.tensor(params.temperature)[:, None], torch.ones(len(params.temperature), 1)):
        x64 = penalized(logits, params)[sampled] / T[sampled].double()
        x = penalized(logits, params, dtype)[sampled] / T[sampled].to(dtype)
        truth, ours = torch.softmax(x64, -1), torch.softmax(x, -1).double()
        big = truth > TINY
        if bool(big.any()):
            worst = max(worst, float(((ours[big] - truth[big]).abs() / truth[big]).max()))
    return tol.k * 2 * worst + (V + 1) * eps + tol.floor


class ProcessedLM:
    """An LM (llm_inference_harness.sampling.lm) whose every row is the reference's processing of log p with one row of
    parameters: the distribution a speculative sampler's output must follow when the request samples with them."""

    def __init__(self, lm, params: SamplingParams, order: str = "transformers", ties: str = "index") -> None:
        self.lm, self.params, self.order, self.ties = lm, params, order, ties
        self.vocab_size = lm.vocab_size

    def __call__(self, prefixes, n=1):
        p = self.lm(prefixes, n)  # (B, n, V)
        rows = p.reshape(-1, p.shape[-1])  # (B n, V)
        params = self.params.select([0] * len(rows))
        return processed(rows.log(), params, order=self.order, ties=self.ties).reshape(p.shape)
