"""Plain autoregressive sampling: x_t ~ p(. | x_<t), one target call per token (the oracle's sampler).

Invariant: its output distribution is the target's, by definition; the float64 reference in
harness/references.py computes the same distribution without sampling.
"""

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated
from llm_inference_harness.engine.registry import register


@register("speculative", "autoregressive", dtypes=("float64",),
          cite="the definition of sampling", caps={"draft": False})
def autoregressive(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos, needs_draft=False)
    target = validated(target, "target")
    out, rounds = [], []
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        out.append(int(rng.categorical(target([[*prompt, *out]])[0, -1])))
        rounds.append(Round(drafted=0, accepted=0, target_calls=1))
    return Generation(out, rounds)
