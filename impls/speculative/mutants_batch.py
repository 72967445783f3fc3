"""Known-wrong batch-invariant sampler: the batch form of impls/speculative/batch_invariant.py with one
generator for the whole batch -- every row draws from the first row's, in batch order, as a sampler
without per-request generators does -- so row i's draws depend on how many rows draw before it and what they
draw.  One sequence alone is sampled exactly as the correct sampler does (its distribution is the target's);
only a batch shows the bug.  vLLM's per-request ``SamplingParams(seed=...)`` generators exist for this.
"""

from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.speculative.batch_invariant import sample_rows


def one_generator(target, draft, prompts, *, gamma, max_new_tokens, rngs, eos=None):
    return sample_rows(target, draft, prompts, gamma=gamma, max_new_tokens=max_new_tokens,
                       rngs=[rngs[0]] * len(rngs), eos=eos)


@register("speculative", "mutant_one_generator_for_the_batch", dtypes=("float64",), mutant=True,
          bug="every row of a batch draws from the first row's generator: row i's draws depend on the rows "
              "before it", killed_by=("rows_are_batch_invariant",),
          caps={"batch_invariant": True, "deterministic": True})
def one_generator_for_the_batch(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    return one_generator(target, draft, [prompt], gamma=gamma, max_new_tokens=max_new_tokens, rngs=[rng], eos=eos)[0]


one_generator_for_the_batch.batched = one_generator
