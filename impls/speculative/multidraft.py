"""Multi-draft speculative sampling over a token tree (Miao et al. 2024, SpecInfer, section 4.2, multi-step
speculative sampling): the draft samples `width` independent chains of k tokens, the target scores every
chain in one batched call, and verification walks the tree: at each depth the candidates are the next
tokens of the chains that agree with everything accepted so far, tried in turn -- candidate x is accepted
with min(1, p(x) / q(x)); after a rejection p becomes norm(max(0, p - q)) for the next candidate; when all
are rejected a token is drawn from the last p; a bonus token follows a fully accepted chain.
Invariant: the candidates at a depth are i.i.d. from q given the accepted prefix, so each rejection step
is the one-candidate rule applied to the updated p, and the emitted token is distributed as p.
"""

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.speculative.standard import residual

WIDTH = 2


class TreeSpeculative:
    """The sampler object: ``next_p`` is the one step a variation replaces (impls/speculative/mutants.py)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __call__(self, target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
        check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
        target, draft = validated(target, "target"), validated(draft, "draft")
        out, rounds = [], []
        while len(out) < max_new_tokens and (not out or out[-1] != eos):
            ctx = [*prompt, *out]
            k = min(gamma, max_new_tokens - len(out) - 1)
            chains, qs = [[] for _ in range(WIDTH if k else 1)], [[] for _ in range(WIDTH if k else 1)]
            for chain, q in zip(chains, qs, strict=True):
                for _ in range(k):
                    q.append(draft([ctx + chain])[0, -1])  # (V,)
                    chain.append(int(rng.categorical(q[-1])))
            p = target([ctx + chain for chain in chains], k + 1)  # (width, k + 1, V): the whole tree in one call
            new, p_now, alive = self.walk(rng, p, qs, chains, k)
            drafted = len(new)
            new.append(int(rng.categorical(p_now if drafted < k else p[alive[0], k])))
            if eos in new:
                new = new[: new.index(eos) + 1]
            out += new
            rounds.append(Round(drafted=k, accepted=drafted, target_calls=1))
        return Generation(out, rounds)

    def walk(self, rng, p, qs, chains, k):
        """Verification down the tree: (accepted tokens, the p a replacement is drawn from, the chains alive)."""
        alive, new, p_now = list(range(len(chains))), [], p[0, 0]
        while len(new) < k:
            first = alive[0]  # every alive chain shares the accepted prefix, hence p and q at this depth
            p_now, q_now, accepted = p[first, len(new)], qs[first][len(new)], None
            for j in alive:
                x = chains[j][len(new)]
                if bool(rng.bernoulli((p_now[x] / q_now[x]).clamp(max=1.0))):
                    accepted = x
                    break
                p_now = self.next_p(p_now, q_now)
            if accepted is None:
                break
            new.append(accepted)
            alive = [j for j in alive if chains[j][len(new) - 1] == accepted]
        return new, p_now, alive

    def next_p(self, p, q):
        """The target distribution the next candidate is judged against, after one was rejected."""
        return residual(p, q)


multidraft = register("speculative", "multidraft", dtypes=("float64",), caps={"draft_width": WIDTH},
                      cite="Miao et al. 2024 (SpecInfer), section 4.2, multi-step speculative sampling")(
    TreeSpeculative())
