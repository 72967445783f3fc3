"""Batch-invariant speculative sampling: B sequences share every draft and target call, and each row draws
only from its own generator, in the order the single-sequence sampler draws (Leviathan et al. 2023,
Algorithm 1, one row per sequence; per-request generators as vLLM's ``SamplingParams(seed=...)``).

Unlike impls/speculative/batched.py -- one generator for the batch, and one draft length for all rows, the
shortest any row can use -- row b drafts min(gamma, its own budget - 1) tokens and its draft, acceptance
and last-token draws come from ``rngs[b]`` alone, so its tokens are those of sampling it alone with that
generator, whatever the other rows are, how many, in which order, and when they finish.  Rows are verified
in one target call per distinct draft length (the LM protocol scores the same number of positions for
every prefix).  Invariant: ``batched(..., prompts, rngs=rngs)[b]`` equals the single-sequence call on
``prompts[b]`` with ``rngs[b]``, token for token and round for round, when the models' rows are those of
each prefix alone (exact tables; a batch-invariant model).
"""

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.speculative.standard import residual


def sample_rows(target, draft, prompts, *, gamma, max_new_tokens, rngs, eos=None) -> list[Generation]:
    for prompt in prompts:
        check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    if len(rngs) != len(prompts):
        raise ValueError(f"speculative: rngs must hold one generator per prompt, got {len(rngs)} for {len(prompts)}")
    target, draft = validated(target, "target"), validated(draft, "draft")
    outs, rounds = [[] for _ in prompts], [[] for _ in prompts]
    while live := [b for b, o in enumerate(outs) if len(o) < max_new_tokens and (not o or o[-1] != eos)]:
        ctx = {b: [*prompts[b], *outs[b]] for b in live}
        k = {b: min(gamma, max_new_tokens - len(outs[b]) - 1) for b in live}  # each row its own budget
        xs, qs = {b: [] for b in live}, {b: [] for b in live}
        for i in range(max(k.values())):
            rows = [b for b in live if k[b] > i]
            q = draft([ctx[b] + xs[b] for b in rows])[:, -1]  # (rows, V)
            for j, b in enumerate(rows):
                xs[b].append(int(rngs[b].categorical(q[j])))
                qs[b].append(q[j])
        p = {}
        for n in sorted(set(k.values())):  # one verify call per draft length
            rows = [b for b in live if k[b] == n]
            p.update(zip(rows, target([ctx[b] + xs[b] for b in rows], n + 1), strict=True))  # (n + 1, V) each
        for b in live:
            n = 0  # x_n accepted with probability min(1, p_n(x_n) / q_n(x_n)), from row b's generator
            while n < k[b] and bool(rngs[b].bernoulli(min(1.0, float(p[b][n, xs[b][n]]) / float(qs[b][n][xs[b][n]])))):
                n += 1
            last = rngs[b].categorical(residual(p[b][n], qs[b][n]) if n < k[b] else p[b][k[b]])
            new = [*xs[b][:n], int(last)]
            outs[b] += new[: new.index(eos) + 1] if eos in new else new
            rounds[b].append(Round(drafted=k[b], accepted=n, target_calls=1))
    return [Generation(o, r) for o, r in zip(outs, rounds, strict=True)]


@register("speculative", "batch_invariant", dtypes=("float64",), caps={"batch_invariant": True, "deterministic": True},
          cite="Leviathan et al. 2023, Algorithm 1, batched over sequences with one generator per sequence")
def batch_invariant(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    """The contract's single sequence as a batch of one; ``batch_invariant.batched`` is the batch form."""
    return sample_rows(target, draft, [prompt], gamma=gamma, max_new_tokens=max_new_tokens, rngs=[rng], eos=eos)[0]


batch_invariant.batched = sample_rows
