"""Greedy speculative decoding: draft tokens are the draft's argmax; x_i is accepted iff it is the target's
argmax at its position; the first mismatch is replaced by the target's argmax, and after k accepted
tokens the target's argmax at position k + 1 is a bonus token (Leviathan et al. 2023, section 2.3, at
temperature 0).  Invariant: the output is the target's greedy output, token for token (ties go to the
lowest token id in both).
"""

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated
from llm_inference_harness.engine.registry import register


@register("speculative", "greedy", dtypes=("float64",),
          cite="Leviathan et al. 2023, section 2.3 (temperature 0)", caps={"greedy": True})
def greedy(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    target, draft = validated(target, "target"), validated(draft, "draft")
    out, rounds = [], []
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        ctx = [*prompt, *out]
        k = min(gamma, max_new_tokens - len(out) - 1)
        xs = []
        for _ in range(k):
            xs.append(int(draft([ctx + xs])[0, -1].argmax()))
        best = target([ctx + xs], k + 1)[0].argmax(-1).tolist()  # (k + 1,) target argmax per position
        n = 0
        while n < k and xs[n] == best[n]:
            n += 1
        new = [*xs[:n], best[n]]
        if eos in new:
            new = new[: new.index(eos) + 1]
        out += new
        rounds.append(Round(drafted=k, accepted=n, target_calls=1))
    return Generation(out, rounds)
