"""Known-wrong samplers, each a correct implementation with one method or attribute replaced by a bug that serving
stacks have shipped (the link names the public report or fix).  The properties must kill every one, by the
property it names.
"""

import torch

from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.sampling.batched import Batched, BatchedProbs
from llm_inference_harness.impls.sampling.gumbel_max import GumbelMax
from llm_inference_harness.impls.sampling.rejection import IndexTies
from llm_inference_harness.impls.sampling.sort_based import SortBased

EXACT = ("distribution_matches_reference", "parameter_grid_exactly")


class TopPDropsCrossingToken(Batched):
    """Keeps a token while the mass up to and including it is <= top_p, so the token that crosses top_p is dropped
    (llama.cpp PR #1953 fixed this off-by-one; the same in Biohub/esm PR #360 and fishaudio/fish-speech PR #1171)."""

    def top_p(self, x, rows):
        p = torch.softmax(x, -1)  # (B, V)
        values = x.sort(-1).values  # (B, V) ascending
        cum = torch.softmax(values, -1).cumsum(-1)
        above = cum[:, -1:] - cum.gather(1, torch.searchsorted(values, x, right=True) - 1)  # (B, V)
        top = rows["top_p"][:, None]
        first = x == x.amax(-1, keepdim=True)
        return x.masked_fill((above + p > top) & (top < 1) & ~first, -torch.inf)


class TopKAfterTopP(Batched):
    """Applies top-p before top-k while declaring vLLM's order, top-k last (vLLM before PR #1885 applied them in the
    opposite order to transformers' and FasterTransformer's)."""

    stages = ("temperature", "min_p", "top_p", "top_k")


class MinPBeforeTemperature(Batched):
    """Measures min-p on the untempered distribution (a min-p mask applied to the raw logits before temperature:
    vllm-project/vllm-metal PR #728's review)."""

    stages = ("min_p", "temperature", "top_k", "top_p")


class TopKZeroKeepsOne(Batched):
    """Reads top_k = 0 (off) as k = 1, greedy (abetlen/llama-cpp-python issue #220)."""

    def top_k(self, x, rows):
        return super().top_k(x, {**rows, "top_k": rows["top_k"].clamp(min=1)})


class RepetitionDividesNegativeLogits(Batched):
    """Divides every seen logit by the penalty, so a negative one rises and the repeated token becomes more likely
    (huggingface/transformers issue #2302, fixed by PR #2303; NVIDIA-NeMo issue #8194)."""

    def repetition(self, z, seen, r):
        return torch.where(seen, z / r, z)


class PenaltiesCountThePrompt(Batched):
    """Counts the prompt's tokens in the frequency and presence penalties, which apply to generated tokens only
    (osaurus-ai/vmlx-swift issue #295; vllm-project/vllm-metal PR #69; NVIDIA/TensorRT-LLM PR #5623)."""

    def output_counts(self, params, B, V):
        return torch.stack([torch.bincount(torch.tensor(p + o, dtype=torch.int64), minlength=V)
                            for p, o in zip(params.prompt_tokens, params.output_tokens, strict=True)]) if B else \
            torch.zeros(0, V)


class MinPAgainstBatchMaximum(Batched):
    """Scales min_p by the largest probability of the whole batch instead of the row's, keeping each row's top
    token (a per-row threshold reduced over every axis: ml-explore/mlx-lm PR #1575)."""

    def min_p(self, x, rows):
        p = torch.softmax(x, -1)  # (B, V)
        top = p == p.amax(-1, keepdim=True)  # min_tokens_to_keep = 1
        batch_max = torch.cat([p.flatten(), p.new_zeros(1)]).max()
        return x.masked_fill((p < rows["min_p"][:, None] * batch_max) & ~top, -torch.inf)


class TopPOfAnotherRow(Batched):
    """Reads each row's top_p at the previous row's index (per-request thresholds indexed by the wrong row:
    flashinfer-ai/flashinfer PR #5324)."""

    def parameters(self, params, logits):
        rows = super().parameters(params, logits)
        return {**rows, "top_p": rows["top_p"].roll(1)}


class OneUniformForTheBatch(Batched):
    """Every row inverts its CDF at the same uniform, so the rows' draws are perfectly correlated (one seeded
    SamplingParams broadcast to a batch gives every prompt the same noise: vllm-project/vllm issue #50440).  Drawn
    exactly: the uniform's position among all rows' CDF breakpoints is one categorical draw."""

    def draw(self, rng, probs):
        cdf = probs.double().cumsum(-1)  # (B, V)
        cuts = torch.cat([torch.zeros(1, dtype=torch.float64), cdf.flatten().clamp(max=1).unique()])  # sorted
        piece = int(rng.categorical(cuts.diff() / cuts.diff().sum()))  # u lies in (cuts[piece], cuts[piece + 1]]
        u = torch.full((probs.shape[0], 1), float(cuts[piece + 1]), dtype=torch.float64)
        return torch.searchsorted(cdf, u).flatten().clamp(max=probs.shape[1] - 1).to(probs.device)


class GreedyOnlyWhenEveryRowIs(Batched):
    """Takes the greedy path only when the whole batch is greedy; otherwise a temperature-0 row is sampled at the
    temperature 1 it was given to avoid a division by zero (microsoft/sarathi-serve issue #61;
    sgl-project/sglang PR #23296)."""

    def greedy(self, rows):
        greedy = rows["temperature"] == 0
        return greedy if bool(greedy.all()) else torch.zeros_like(greedy)


class TiesToTheHighestId(SortBased):
    """Sorts ascending and reverses, so tokens tied at a boundary are taken highest id first while it declares the
    lowest (transformers' TopPLogitsWarper sorts ascending, vLLM descending: vllm-project/vllm PR #1885)."""

    def sort(self, z):
        values, order = torch.sort(z, stable=True)
        return values.flip(0), order.flip(0)


class TopPOverUnrenormalizedTopK(SortBased):
    """Sums top-p's mass over the distribution before top-k, not renormalized over the top-k tokens
    (ml-explore/mlx-lm PR #388: top-k did not preserve the distribution that top-p assumes sums to one)."""

    def top_p(self, x, keep, params, b):
        if params.top_p[b] >= 1:
            return keep
        q = torch.softmax(x, -1) * keep  # (V,): the untruncated distribution's mass on the kept prefix
        before = q.cumsum(-1) - q
        return keep & ((before < params.top_p[b]) | (torch.arange(len(x)) == 0))


class ValuePredicatesForIndexTies(IndexTies):
    """Declares ties broken by id (exactly k tokens) but tests the drawn token by value alone, accepting every
    token tied at the boundary (flashinfer-ai/flashinfer PR #3774)."""

    ties = "keep"


class TemperatureTwice(GumbelMax):
    """Divides by the temperature again where the noise is added (Adibvafa/CodonTransformer issue #19, PR #20)."""

    def scores(self, probs, params):
        return probs.double().log() / torch.tensor(params.temperature, dtype=torch.float64)[:, None].clamp(min=1e-6)


class ReciprocalTemperatureInBatches(BatchedProbs):
    """Multiplies by 1/T when the batch has more than one row and divides by T for one row: the same row gets other
    bits in a batch (a batch-size-dependent path; vllm-project/vllm issue #5898)."""

    def temperature(self, x, rows):
        T = rows["temperature"][:, None]
        T = torch.where(T > 0, T, 1)
        return x * (1 / T) if x.shape[0] > 1 else x / T


def _register(name: str, cls: type, killed_by: tuple[str, ...], **caps) -> None:
    register("sampling", f"mutant_{name}", dtypes=("float32", "float64"), mutant=True,
             bug=" ".join(cls.__doc__.split()), killed_by=killed_by, caps=caps)(cls())


VLLM, INDEX = {"order": "vllm", "ties": "keep"}, {"order": "transformers", "ties": "index"}
_register("top_p_drops_the_crossing_token", TopPDropsCrossingToken, EXACT, **VLLM)
_register("top_k_after_top_p", TopKAfterTopP, EXACT, **VLLM)
_register("min_p_before_temperature", MinPBeforeTemperature, EXACT, **VLLM)
_register("top_k_zero_keeps_one", TopKZeroKeepsOne, EXACT, **VLLM)
_register("repetition_divides_negative_logits", RepetitionDividesNegativeLogits, EXACT, **VLLM)
_register("penalties_count_the_prompt", PenaltiesCountThePrompt, EXACT, **VLLM)
_register("min_p_against_the_batch_maximum", MinPAgainstBatchMaximum, ("rows_are_independent", *EXACT), **VLLM)
_register("top_p_of_another_row", TopPOfAnotherRow, ("rows_are_independent", *EXACT), **VLLM)
_register("one_uniform_for_the_batch", OneUniformForTheBatch, ("rows_are_independent",), **VLLM)
_register("greedy_only_when_every_row_is", GreedyOnlyWhenEveryRowIs, ("greedy_rows_take_the_first_argmax",), **VLLM)
_register("ties_to_the_highest_id", TiesToTheHighestId, EXACT, **INDEX)
_register("top_p_over_unrenormalized_top_k", TopPOverUnrenormalizedTopK, EXACT, **INDEX)
_register("value_predicates_for_index_ties", ValuePredicatesForIndexTies, EXACT, **INDEX)
_register("gumbel_temperature_twice", TemperatureTwice, ("statistical_fit_large_vocabulary",), rng="own", order="vllm")
_register("reciprocal_temperature_in_batches", ReciprocalTemperatureInBatches, ("rows_are_batch_invariant",),
          returns="probs", order="vllm", batch_invariant=True, deterministic=True)
