"""Sampling by the Gumbel-max trick: argmax_i(log p_i + g_i) with g_i = -log(-log u_i), u_i ~ U(0, 1), is a draw
from p (Gumbel 1954; Maddison et al. 2014, Sec. 2), one noise vector per row, no cumulative sum and no sort.  p is
the processed distribution of the batched implementation (impls/sampling/batched.py), so the filters'
zeros stay zeros (log 0 = -inf never wins); a greedy row takes its argmax without noise.

It draws its uniforms from a torch.Generator of its own seeded with ``rng`` (caps rng="own"): continuous noise
cannot be enumerated, so the statistical tier judges it.
"""

import torch

from llm_inference_harness.contracts.sampling import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.sampling.batched import Batched


class GumbelMax(Batched):
    def __call__(self, logits, params, *, rng):
        check_inputs(logits, params)
        probs = self.probs(logits, params)  # (B, V)
        gen = torch.Generator(device=logits.device).manual_seed(rng)
        u = torch.rand(probs.shape, generator=gen, dtype=torch.float64, device=logits.device).clamp(min=1e-300)
        noisy = self.scores(probs, params) - (-u.log()).log()  # (B, V): log p + Gumbel noise
        greedy = torch.tensor(params.temperature, device=logits.device) == 0
        return torch.where(greedy, probs.argmax(-1), noisy.argmax(-1))

    def scores(self, probs, params):
        """(B, V) float64: the log-probabilities the noise is added to."""
        return probs.double().log()


gumbel_max = register("sampling", "gumbel_max", dtypes=("float32", "float64"),
                      cite="Gumbel-max trick (Maddison et al. 2014, Sec. 2) over vLLM's processed distribution",
                      caps={"rng": "own", "order": "vllm", "ties": "keep"})(GumbelMax())
