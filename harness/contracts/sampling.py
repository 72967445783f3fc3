"""The sampling contract: logits processing, and samplers whose output distribution is computed exactly.

    process(logits, params) -> probs (B, V)          an implementation declaring caps returns="probs"
    sample(logits, params, *, rng) -> tokens (B,)    the default, returns="tokens"

Imports a plugin needs: ``from llm_inference_harness import declare``; ``from llm_inference_harness.contracts.sampling
import SamplingParams, check_inputs, draw``.  docs/examples/sampling.py is a complete sampler written from this text.

* logits: a float tensor (B, V), float32 or float64 as declared; -inf marks a token that may never be drawn
  (a grammar's mask), NaN and +inf are invalid, and every row has at least one finite logit.
* params (`SamplingParams`): a frozen dataclass of per-row tuples, each of length B -- temperature, top_k,
  top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty, and each row's history: prompt_tokens
  and output_tokens (token ids in [0, V)).  Plain data: it crosses a process boundary as it is.
* Row b's processed distribution, from its logits l:
  1. Penalties, always first, in vLLM's order.  Repetition r (off: 1.0) on every id of prompt_tokens and
     output_tokens, once per id: l_i / r where l_i > 0, l_i * r otherwise (Keskar et al. 2019, CTRL, Sec. 4.1,
     as transformers and vLLM apply it: a penalty > 1 lowers a negative logit too).  Then frequency f and
     presence a (off: 0.0) on the ids of output_tokens only, with c_i the count of id i there:
     l_i -= f c_i + a [c_i > 0] (OpenAI's definition, as vLLM applies it; the prompt is not counted).
  2. temperature 0 is greedy: the distribution is one-hot at the largest penalized logit, ties to the lowest
     id (torch.argmax's rule); the filters below never drop that token, so they do not change it.
  3. Otherwise four stages in the declared order (caps ``order``; ORDERS): temperature T (off: 1.0) divides the
     values the later stages see; top_k (off: 0) keeps the k highest-ranked tokens; top_p (off: 1.0) keeps a
     token when the probability of the tokens ranked before it is below top_p -- the smallest set of most
     probable tokens whose mass reaches top_p (Holtzman et al. 2020, Eq. 2), the mass taken over the
     distribution renormalized to the tokens kept so far; min_p (off: 0.0) keeps tokens with p_i >= min_p *
     max_j p_j (llama.cpp PR #3841).  A filter before temperature selects tokens by the untempered values.
  4. The processed distribution is softmax(l / T) over the tokens kept: zero elsewhere.
* Ranking and ties (caps ``ties``): tokens rank by value, highest first.  "keep": equal values share a rank --
  top_k keeps every token at least as large as the k-th largest value (transformers' TopKLogitsWarper), top_p
  keeps a token when the mass of the tokens strictly more probable than it is below top_p.  "index": equal
  values rank by token id, lowest first (a stable descending sort): exactly k tokens, a prefix of that order.
* Always kept: the first token of the ranking (min_tokens_to_keep = 1: top_k >= 1, top_p > 0, min_p <= 1 keep
  it), never a token with logit -inf (probability 0), whatever top_k says.
* Rounding at a threshold: a token whose keep-or-drop comparison is equal within the rounding of the implementation's
  dtype may go either way (`llm_inference_harness.references.sampling.threshold_slack` earns the margin).
* A sampler draws one token per row, rows independently, through ``rng`` (`llm_inference_harness.sampling.lm.Rng`) only:
  ``rng.categorical(probs)`` takes float64 rows summing to one within 1e-9 -- ``draw(rng, probs)`` converts and
  renormalizes a float32 row first -- and returns one token per row; ``rng.bernoulli(p)`` a coin.  So
  `llm_inference_harness.sampling.enumeration` visits every branch and the properties compare the sampler's exact output
  distribution.  A sampler that draws from its own generator (Gumbel-max, a CUDA kernel's Philox) declares
  ``caps={"rng": "own"}``: its ``rng`` is then an int seed for a torch.Generator of its own (never torch's global one),
  and the statistical tier judges it.
* Returns: "tokens", a LongTensor (B,) of ids in [0, V) on the logits' device; "probs", a float tensor (B, V),
  each row non-negative and summing to one (its dtype's rounding), zero wherever the token is not kept.  An
  empty batch (B = 0) returns an empty (0,) or (0, V).
* Bad input raises ValueError/TypeError naming the argument (``logits``) or the field (``top_p``):
  ``check_inputs(logits, params)`` does it -- top_p outside (0, 1], min_p outside [0, 1], a negative or
  non-finite temperature, top_k outside [0, V] (top_k > V is an error, not "all"), a repetition penalty <= 0,
  fields of another length than B, history ids outside [0, V).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

import torch

from llm_inference_harness.contracts import Rule, Technique, batch_rules, define
from llm_inference_harness.engine.capabilities import BatchedCaps, cap
from llm_inference_harness.engine.guard import (
    ContractViolation,
    call_limit,
    check_tensor,
    guarded_call,
    is_remote,
    replayed_calls,
)
from llm_inference_harness.sampling.enumeration import outcome_distribution
from llm_inference_harness.sampling.replay import well_formed

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl

# caps order -> the stages after the penalties: transformers' _get_logits_processor; vLLM v1's Sampler (min-p is an
# argmax-invariant logits processor applied before TopKTopPSampler); llama.cpp's default chain (temperature last)
ORDERS = {
    "transformers": ("temperature", "top_k", "top_p", "min_p"),
    "vllm": ("temperature", "min_p", "top_k", "top_p"),
    "llama.cpp": ("top_k", "top_p", "min_p", "temperature"),
}
PARAMS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
OFF = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
       "presence_penalty": 0.0, "frequency_penalty": 0.0}


@dataclass(frozen=True)
class SamplingCaps(BatchedCaps):
    returns: Literal["tokens", "probs"] = cap("tokens", "'tokens': a sampler (one token per row through rng); "
                                                        "'probs': logits processing (the processed distribution)")
    rng: Literal["harness", "own"] = cap("harness", "'own': rng is an int seed for its own generator: not "
                                                    "enumerable, judged by the statistical tier")
    order: Literal["transformers", "vllm", "llama.cpp"] = cap("transformers", "the order of temperature, top_k, "
                                                                              "top_p and min_p (ORDERS)")
    ties: Literal["keep", "index"] = cap("keep", "tokens tied at a top_k / top_p boundary: 'keep' all of them, or "
                                                 "'index': the lower id first")
    params: tuple[str, ...] = cap(PARAMS, "the parameters it applies; cases leave the others off")
    max_vocab: int = cap(0, "the largest V it serves (0: any): an interpreted kernel's")


SAMPLING = define(
    Technique(
        name="sampling",
        signature="sample(logits, params, *, rng) -> tokens (B,)  |  process(logits, params) -> probs (B, V)",
        summary="logits processing (penalties, temperature, top-k, top-p, min-p) and samplers, proved by exact "
                "enumeration",
        properties=("llm_inference_harness.properties.test_sampling",
                    "llm_inference_harness.properties.test_sampling_batch"),
        reference="reference",
        caps=SamplingCaps,
        rules=(
            Rule("distribution", "each row's output distribution is its processed one: penalties, then temperature, "
                                 "top-k, top-p and min-p in the declared order",
                 ("distribution_matches_reference", "parameter_grid_exactly", "statistical_fit_large_vocabulary",
                  "shift_invariance")),
            Rule("greedy", "temperature 0 is one-hot at the largest penalized logit, ties to the lowest id",
                 ("greedy_rows_take_the_first_argmax",)),
            Rule("independent rows", "a row's distribution does not depend on the other rows of its batch",
                 ("rows_are_independent",)),
            Rule("empty batch", "a batch of no rows is an answer: (0,) tokens or (0, V) probabilities",
                 ("empty_batch",)),
            Rule("bad input", "bad parameters and logits raise ValueError/TypeError naming the argument or field",
                 ("rejects_bad_input",)),
            *batch_rules(),
        ),
    )
)


@dataclass(frozen=True)
class SamplingParams:
    """Per-row sampling parameters: every field holds one entry per row (plain values, no behaviour)."""

    temperature: tuple[float, ...]
    top_k: tuple[int, ...]
    top_p: tuple[float, ...]
    min_p: tuple[float, ...]
    repetition_penalty: tuple[float, ...]
    presence_penalty: tuple[float, ...]
    frequency_penalty: tuple[float, ...]
    prompt_tokens: tuple[tuple[int, ...], ...]
    output_tokens: tuple[tuple[int, ...], ...]

    @property
    def rows(self) -> int:
        return len(self.temperature)

    def select(self, rows) -> SamplingParams:
        """These rows' parameters, in this order."""
        return SamplingParams(**{f.name: tuple(getattr(self, f.name)[b] for b in rows) for f in fields(self)})


def sampling_params(B: int, **values) -> SamplingParams:
    """B rows, each parameter off unless given: a scalar (every row) or one value per row; prompt_tokens and
    output_tokens one sequence of ids per row (default: empty)."""
    unknown = set(values) - {f.name for f in fields(SamplingParams)}
    if unknown:
        raise TypeError(f"sampling_params: unknown fields {sorted(unknown)}")

    def per_row(name: str) -> tuple:
        v = values.get(name, OFF[name])
        return tuple(v) if isinstance(v, list | tuple) else (v,) * B

    def histories(name: str) -> tuple:
        return tuple(tuple(h) for h in values.get(name, [()] * B))

    return SamplingParams(**{name: per_row(name) for name in PARAMS}, prompt_tokens=histories("prompt_tokens"),
                          output_tokens=histories("output_tokens"))


def check_inputs(logits: torch.Tensor, params: SamplingParams) -> None:
    """ValueError/TypeError naming the argument or field unless the call fits the contract."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise TypeError(f"sampling: logits must be a 2-d float tensor (B, V), got "
                        f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    if not isinstance(params, SamplingParams):
        raise TypeError(f"sampling: params must be a SamplingParams, got {type(params).__name__}")
    B, V = logits.shape
    if B and not bool((logits < math.inf).all()):  # NaN fails the comparison too
        raise ValueError("sampling: logits must not hold NaN or +inf (-inf masks a token)")
    if B and not bool((logits > -math.inf).any(-1).all()):
        raise ValueError("sampling: logits must have a finite value in every row (a row of -inf has no token)")
    for f in fields(params):
        if len(getattr(params, f.name)) != B:
            raise ValueError(f"sampling: params.{f.name} must hold one entry per row ({B}), got "
                             f"{len(getattr(params, f.name))}")
    check_values(params, V)


def check_values(params: SamplingParams, V: int) -> None:
    """ValueError naming the field of ``params`` whose value the contract forbids for a vocabulary of V."""
    rules = {
        "temperature": (lambda t: math.isfinite(t) and t >= 0, "a finite float >= 0 (0: greedy)"),
        "top_k": (lambda k: isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= V, f"an int in [0, {V}]"),
        "top_p": (lambda p: 0 < p <= 1, "in (0, 1]"),
        "min_p": (lambda p: 0 <= p <= 1, "in [0, 1]"),
        "repetition_penalty": (lambda r: math.isfinite(r) and r > 0, "a finite float > 0"),
        "presence_penalty": (math.isfinite, "finite"),
        "frequency_penalty": (math.isfinite, "finite"),
    }
    for name, (valid, expected) in rules.items():
        bad = [v for v in getattr(params, name) if not (isinstance(v, int | float) and valid(v))]
        if bad:
            raise ValueError(f"sampling: {name} must be {expected}, got {bad[0]!r}")
    for name in ("prompt_tokens", "output_tokens"):
        bad = [t for row in getattr(params, name) for t in row if not (isinstance(t, int) and 0 <= t < V)]
        if bad:
            raise ValueError(f"sampling: {name} must hold token ids in [0, {V}), got {bad[0]!r}")


def draw(rng, probs: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (B, V) through ``rng``, as float64 rows renormalized to sum to one."""
    p = probs.double()
    return rng.categorical(p / p.sum(-1, keepdim=True)).reshape(probs.shape[:-1]).to(probs.device)


def call(impl: Impl, logits: torch.Tensor, params: SamplingParams, rng=None) -> torch.Tensor:
    """Call an implementation under guard and check the promised output: (B, V) probabilities or (B,) tokens."""
    B, V = logits.shape
    kwargs = {} if impl.caps.returns == "probs" else {"rng": rng}
    out = guarded_call(impl.fn, logits, params, arg_names=("logits", "params"), timeout_s=call_limit(impl), **kwargs)
    return checked_output(impl, out, B, V, logits.device)


def checked_output(impl: Impl, out, B: int, V: int, device) -> torch.Tensor:
    """``out`` once it is what ``impl`` promises for B rows of V tokens (ContractViolation otherwise)."""
    if impl.caps.returns == "tokens":
        check_tensor(out, what=impl.name, shape=(B,), dtype=torch.int64, device=device)
        if B and not bool(((out >= 0) & (out < V)).all()):
            raise ContractViolation(f"{impl.name}: returned token ids {out.tolist()} outside [0, {V})")
        return out
    check_tensor(out, what=impl.name, shape=(B, V), device=device)
    if out.dtype not in (torch.float32, torch.float64):
        raise ContractViolation(f"{impl.name}: returned probabilities in {out.dtype}, expected float32 or float64")
    tol = 1e-9 if out.dtype == torch.float64 else 1e-5
    if B and not (bool((out >= 0).all()) and float((out.double().sum(-1) - 1).abs().max()) <= tol):
        raise ContractViolation(f"{impl.name}: returned rows that are not distributions (a negative entry, or a row "
                                f"sum off by more than {tol:g})")
    return out


ENUMERATION_LIMIT_S = 60.0  # per enumerated case: a sampler that loops forever gets a verdict, not a hang
MAX_RUNS = 20_000  # branches of one enumerated case; a correct sampler of the drawn cases needs a few hundred


@dataclass(frozen=True)
class Enumerated:
    joint: dict[tuple[int, ...], float]  # P(row 0 draws t_0, ..., row B-1 draws t_{B-1})
    marginals: torch.Tensor  # (B, V) float64: each row's output distribution


def enumerated(impl: Impl, logits: torch.Tensor, params: SamplingParams) -> Enumerated:
    """A sampler's exact output distribution, every branch of its draws visited
    (`llm_inference_harness.sampling.enumeration`), under guard: the inputs must be left alone, every run's tokens must
    be what the contract promises."""
    B, V = logits.shape

    def run(rng) -> tuple[int, ...]:
        return tuple(checked_output(impl, impl.fn(logits, params, rng=rng), B, V, logits.device).tolist())

    def run_many(paths: list) -> list[tuple]:  # a sampler in its own process: a batch of paths a message
        limit = call_limit(impl) * max(1, len(paths) // 64)
        reports = replayed_calls(impl.fn, (logits, params), paths, timeout_s=limit)
        return [(tuple(checked_output(impl, out, B, V, logits.device).tolist()), new)
                for out, new in replayed_runs(impl.fn.process, reports, paths)]

    joint = guarded_call(outcome_distribution, run, max_runs=MAX_RUNS, run_many=run_many if is_remote(impl.fn)
                         else None, timeout_s=ENUMERATION_LIMIT_S, hang_owner=impl.fn,
                         watch={"logits": logits, "params": params})
    marginals = torch.zeros(B, V, dtype=torch.float64)
    for tokens, prob in joint.items():
        marginals[torch.arange(B), torch.tensor(tokens, dtype=torch.int64)] += prob
    return Enumerated(joint, marginals)


def distribution_of(impl: Impl, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(B, V) float64: what the implementation makes of each row -- its processed distribution, or a sampler's
    exact output distribution by enumeration."""
    if impl.caps.returns == "probs":
        return call(impl, logits, params).double().cpu()
    return enumerated(impl, logits, params).marginals


def replayed_runs(process, reports, paths: list) -> list[tuple]:
    """(output, new choices) of each run a sampler's process reported for ``paths`` (`guard.replayed_calls`), once
    well formed: every choice a draw from a distribution with its outcome possible; what a run raised is raised."""
    from llm_inference_harness.engine import wire

    try:
        if type(reports) is not list or not 0 < len(reports) <= len(paths):
            raise ValueError("a report per path")
        runs = []
        for report in reports:
            if report[0] == "raised" and report is reports[-1]:
                raise wire.decode_exception(report[1])
            tag, out, depth, new = report
            if tag != "run" or type(depth) is not int or type(new) is not list or not well_formed(new):
                raise ValueError("a choice that is not a draw from a distribution")
            runs.append((out, new))
        if len(runs) != len(paths):
            raise ValueError("a report per path")
    except (TypeError, ValueError, IndexError, wire.Malformed) as exc:
        raise process.crash(f"crashed: the implementation's process sent a malformed run ({exc})") from None
    return runs
