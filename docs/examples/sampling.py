"""A complete sampler written against the contract (harness/contracts/sampling.py), as a plugin.

    harness check sampling --plugin docs/examples/sampling.py:sampler

Each row: penalties (repetition over prompt and output ids, frequency and presence over output ids), then
transformers' order -- temperature, top-k, top-p, min-p -- on the row sorted once (stable: tokens tied at a
boundary are taken lowest id first, ties="index"), softmax over the kept prefix, one draw through rng.
"""

import torch

from llm_inference_harness import declare
from llm_inference_harness.contracts.sampling import check_inputs, draw


def penalized(z, params, b):
    """Row b's logits (V,) after its penalties."""
    z = z.clone()
    seen = sorted(set(params.prompt_tokens[b]) | set(params.output_tokens[b]))
    r = params.repetition_penalty[b]
    z[seen] = torch.where(z[seen] > 0, z[seen] / r, z[seen] * r)  # CTRL's penalty: a seen negative logit goes down
    for t in set(params.output_tokens[b]):  # OpenAI's penalties count generated tokens only
        z[t] -= params.frequency_penalty[b] * params.output_tokens[b].count(t) + params.presence_penalty[b]
    return z


def processed(z, params, b):
    """Row b's processed distribution (V,)."""
    T = params.temperature[b]
    if T == 0:
        return torch.nn.functional.one_hot(z.argmax(), len(z)).to(z.dtype)  # greedy: the first largest logit
    values, order = torch.sort(z / T, descending=True, stable=True)  # (V,)
    keep = values > -torch.inf
    if params.top_k[b] > 0:
        keep &= torch.arange(len(z)) < params.top_k[b]
    p = torch.softmax(values.masked_fill(~keep, -torch.inf), -1)  # renormalized over the top-k prefix
    if params.top_p[b] < 1:
        keep &= (p.cumsum(-1) - p < params.top_p[b]) | (torch.arange(len(z)) == 0)  # the mass before each token
        p = torch.softmax(values.masked_fill(~keep, -torch.inf), -1)
    keep &= p >= params.min_p[b] * p[0]  # p[0] is the largest
    p = torch.softmax(values.masked_fill(~keep, -torch.inf), -1)
    return torch.zeros_like(p).scatter(0, order, p)  # back to token order


@declare(dtypes=("float32", "float64"), caps={"order": "transformers", "ties": "index"})
def sampler(logits, params, *, rng):
    check_inputs(logits, params)  # ValueError naming the argument or field
    B, V = logits.shape
    if B == 0:
        return torch.zeros(0, dtype=torch.int64)
    probs = torch.stack([processed(penalized(logits[b], params, b), params, b) for b in range(B)])  # (B, V)
    return draw(rng, probs)  # one token per row, through the harness's rng
