"""The speculative-decoding sampler contract: a sampler whose output distribution is exactly the target's.

    sampler(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None) -> Generation

Imports a plugin needs: ``from llm_inference_harness import declare`` (capabilities), ``from
llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated``; the protocols below
are ``llm_inference_harness.sampling.lm.LM`` and ``llm_inference_harness.sampling.lm.Rng``, with
``llm_inference_harness.sampling.lm.TableLM(table)`` and ``llm_inference_harness.sampling.lm.TorchRng(seed)`` to try a
sampler by hand.  docs/examples/speculative_sampler.py is a complete sampler written from this text alone.

* target, draft (`llm_inference_harness.sampling.lm.LM`): ``lm.vocab_size`` is V; ``lm(prefixes, n=1)`` takes a list of
  prefixes, each a non-empty ``list[int]`` of token ids (they may differ in length), and returns a float64 tensor
  (B, n, V) whose row [b, i] is the next-token distribution after the first ``len(prefixes[b]) - n + 1 + i``
  tokens of prefix b: ``target([ctx + xs], len(xs) + 1)[0]`` is p_1 .. p_{k+1} for k drafts xs.  Temperature
  is already applied (`llm_inference_harness.sampling.lm.Tempered`).  draft may be None for a sampler that needs none
  (plain autoregressive sampling, ``caps={"draft": False}``).
* prompt: a non-empty ``list[int]``, left unchanged (build ``prompt + out``, never append to it); gamma >= 1
  draft tokens per round; at most max_new_tokens tokens are generated, fewer when eos is generated (it is
  included, and nothing after it).
* rng (`llm_inference_harness.sampling.lm.Rng`), the only source of randomness, so that
  `llm_inference_harness.sampling.enumeration` can visit every branch: ``rng.categorical(probs)`` draws one token per
  row of a float64 (V,) or (B, V) tensor of probabilities (a long tensor of shape probs.shape[:-1]:
  ``int(rng.categorical(q))``); ``rng.bernoulli(p)`` draws a coin of probability p, a float or a tensor (a bool tensor:
  ``bool(rng.bernoulli(0.3))``).  A sampler that draws from torch's RNG itself declares ``caps={"rng": "own"}`` and is
  checked statistically instead.
* Rounds.  A round starts with a model call on the prompt plus the tokens emitted so far, drafts k <= gamma
  tokens and verifies them in one target call that scores the k drafts and the position before them:
  ``target([prompt + out + drafts], n=k + 1)`` (the first round's call may score more positions, as a KV
  cache filling on the prompt does).  Round boundaries follow from the target calls alone: the next round's
  target call names the tokens emitted before it, whatever the kind of the round's last draw (a categorical,
  a chain of Bernoulli coins, or a kept draft with no draw after it).  A call that scores other positions is
  never mistaken for a round's end; the runs are then played out (exact, but slow).
* The round's last draw is emitted as drawn: a round whose last choice is a categorical over the vocabulary
  and emits its token would have emitted any other token of that draw in its place, with the same
  tokens before it (the enumeration runs two of its outcomes, and eos, and settles the rest from them).
* Rounds depend only on the tokens so far (no state carried between rounds), so a sampler restarted
  from prompt + the tokens it emitted continues as it would have; declare ``caps={"markov": False}``
  otherwise (enumerated run by run, every round played out).  A sampler that drafts fewer than gamma
  tokens where it likes (stopping when the draft is unsure) declares ``caps={"adaptive_gamma": True}``.
* The budget rule (efficiency, part of the contract): a round drafts at most max_new_tokens - len(out) tokens,
  the tokens it may still emit (``min(gamma, max_new_tokens - len(out) - 1)`` leaves room for the bonus).  A
  draft past the budget is never emitted, costs a draft call and multiplies the branches to enumerate by V:
  the enumerating properties stop at the first such round, failing with
  `llm_inference_harness.sampling.enumeration.DraftsPastBudget`, which names this rule, within seconds.
* The bonus rule (efficiency, part of the contract): a round that accepts all its k drafts also emits a
  bonus token from the target's next row p_{k+1}, k + 1 tokens for one target call, so that tokens per call
  is the formula (1 - a^(k+1)) / (1 - a) of Leviathan et al. 2023, section 3.1.  A sampler that never takes
  the bonus is exact, so matches_target_distribution passes, but it breaks this rule, a contract violation
  judged on efficiency: tokens_per_call_matches_formula and draft_equal_to_target_accepts_everything fail
  naming "the contract's bonus rule", and so does round_records_add_up once a drawn case has a round before
  the last that accepts all its drafts.  (A round may stop at max_new_tokens or at eos without a bonus.)
* Processed distributions.  A serving engine samples from the target's distribution after temperature, top-k, top-p and
  min-p (harness/contracts/sampling.py), and its draft proposes from its own processed distribution.  A sampler given
  processed models is just given other models (`llm_inference_harness.references.sampling.ProcessedLM`): the output must
  follow the processed target.  A sampler that processes the rows itself declares ``caps={"processes": True}`` and is
  called with the raw models and ``target_params=``, ``draft_params=`` (both absent elsewhere: the models are then
  sampled as given) -- a one-row `llm_inference_harness.contracts.sampling.SamplingParams` each, penalties off --
  applied in transformers' order, tokens tied at a boundary lowest id first (ties "index"); its output must follow the
  target processed with target_params, whatever draft_params are.  ``check_processing(params, "target_params", V)``
  checks one.
* Returns a `Generation(tokens, rounds)`: ``tokens`` the generated ``list[int]`` (the prompt not included),
  ``rounds`` one `Round(drafted, accepted, target_calls)` per round: ``drafted`` the draft tokens proposed
  (the depth of the tree for a multi-draft sampler), ``accepted`` how many of them the target accepted (not
  counting the replacement or bonus token), ``target_calls`` the target calls the round made (1).  A round
  before the last emits accepted + 1 tokens.  A sampler that keeps no round records declares
  ``rounds=False`` and returns a plain list of tokens: round_records_add_up then skips, saying so, and
  everything else is checked as for a Generation.  A plain list from a sampler that does not declare it
  fails round_records_add_up, naming the capability.
* Bad input -- gamma < 1, models with different vocabularies, an empty prompt, distributions that are
  negative, NaN or do not sum to one -- raises ValueError naming the argument: ``check_inputs(target, draft,
  prompt, gamma, max_new_tokens, eos)`` checks the arguments, ``validated(lm, "target")`` wraps a model so
  that every row it returns is checked.

The output distribution must equal the target's autoregressive distribution, whatever the draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from llm_inference_harness.contracts import Rule, Technique, batch_rules, define
from llm_inference_harness.contracts.sampling import SamplingParams, check_values
from llm_inference_harness.engine.capabilities import BatchedCaps, cap
from llm_inference_harness.engine.guard import ContractViolation, call_limit, guarded_call
from llm_inference_harness.sampling.lm import LM, check_distribution

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl


@dataclass(frozen=True)
class SpeculativeCaps(BatchedCaps):
    rng: Literal["harness", "own"] = cap("harness", "'own': draws from torch's RNG itself, so it is checked "
                                                    "statistically instead of by exact enumeration")
    greedy: bool = cap(False, "deterministic (argmax) decoding: checked against the target's greedy continuation")
    draft: bool = cap(True, "reads the draft model; False: plain autoregressive sampling")
    draft_width: int = cap(1, "draft chains per round (a multi-draft / tree sampler)")
    markov: bool = cap(True, "rounds depend only on the tokens so far; False: state carried between rounds "
                             "(enumerated run by run)")
    adaptive_gamma: bool = cap(False, "drafts fewer than gamma tokens where it likes: tokens per call is bounded "
                                      "by the fixed-gamma formula, not equal to it")
    rounds: bool = cap(True, "returns a Generation with its Round records; False: a plain list of tokens "
                             "(round_records_add_up skips)")
    processes: bool = cap(False, "takes raw models with target_params / draft_params and applies temperature, top-k, "
                                 "top-p and min-p to each side itself")


SPECULATIVE = define(
    Technique(
        name="speculative",
        signature="sampler(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None) -> Generation",
        summary="sampling with a draft model whose output distribution is exactly the target's",
        properties=("llm_inference_harness.properties.test_speculative",
                    "llm_inference_harness.properties.test_speculative_batch",
                    "llm_inference_harness.properties.test_speculative_processed"),
        reference="autoregressive",
        caps=SpeculativeCaps,
        rules=(
            Rule("distribution", "the output distribution equals the target's autoregressive distribution, whatever "
                                 "the draft",
                 ("matches_target_distribution", "matches_target_distribution_on_found_cases",
                  "matches_target_distribution_run_by_run", "matches_target_distribution_on_tiny_models",
                  "goodness_of_fit", "matches_processed_target_distribution")),
            Rule("greedy", "greedy speculative output is the target's greedy output, token for token",
                 ("greedy_matches_target_greedy",)),
            Rule("round records", "the Round records tell the truth: target calls, drafted and accepted tokens add "
                                  "up to what the target saw and the tokens emitted", ("round_records_add_up",)),
            Rule("bonus", "a round that accepts all its k drafts also emits a bonus token from p_{k+1}: "
                          "(1 - a^(k+1)) / (1 - a) tokens per target call",
                 ("tokens_per_call_matches_formula", "draft_equal_to_target_accepts_everything",
                  "round_records_add_up")),
            Rule("bad input", "bad probabilities, gamma < 1 and differing vocabularies raise ValueError naming the "
                              "argument", ("rejects_bad_input",)),
            *batch_rules(),
        ),
    )
)


@dataclass(frozen=True)
class Round:
    drafted: int  # draft tokens proposed in a chain (the depth of the tree for multi-draft samplers)
    accepted: int  # of which the target accepted
    target_calls: int  # target calls this round (1 for speculative sampling)


@dataclass
class Generation:
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)

    @property
    def target_calls(self) -> int:
        return sum(r.target_calls for r in self.rounds)


def check_inputs(target: LM, draft: LM | None, prompt: Sequence[int], gamma: int, max_new_tokens: int,
                 eos: int | None = None, *, needs_draft: bool = True) -> None:
    """ValueError/TypeError naming the argument unless the call fits the contract (``needs_draft``: the
    sampler reads ``draft``, so None is an error, not an AttributeError later)."""
    if needs_draft and draft is None:
        raise TypeError("speculative: draft must be a model (a callable with vocab_size), got None")
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"speculative: gamma must be an int >= 1, got {gamma!r}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"speculative: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    V = target.vocab_size
    if draft is not None and draft.vocab_size != V:
        raise ValueError(f"speculative: draft vocabulary {draft.vocab_size} differs from the target's {V}")
    if len(prompt) == 0 or not all(isinstance(t, int) and 0 <= t < V for t in prompt):
        raise ValueError(f"speculative: prompt must be a non-empty list of token ids in [0, {V}), got {prompt!r}")
    if eos is not None and not (isinstance(eos, int) and 0 <= eos < V):
        raise ValueError(f"speculative: eos must be None or a token id in [0, {V}), got {eos!r}")


def check_processing(params, name: str, vocab_size: int) -> None:
    """ValueError/TypeError naming ``name`` unless it is one row of valid sampling parameters with penalties off."""
    if not isinstance(params, SamplingParams) or params.rows != 1:
        raise TypeError(f"speculative: {name} must be a one-row SamplingParams, got {params!r}")
    if (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) != ((1.0,), (0.0,), (0.0,)):
        raise ValueError(f"speculative: {name} must leave the penalties off (they read the history, not the model)")
    try:
        check_values(params, vocab_size)
    except ValueError as exc:
        raise ValueError(f"speculative: {name}: {exc}") from None


class validated:  # noqa: N801 - used like a function: validated(target, "target")
    """Wraps a model so that every distribution it returns is checked (ValueError naming the model)."""

    def __init__(self, lm: LM, name: str) -> None:
        self.lm, self.vocab_size, self.name = lm, lm.vocab_size, name

    def __call__(self, prefixes, n=1):
        p = self.lm(prefixes, n)
        if not getattr(p, "checked_distribution", False):  # the enumerator's memoized rows are checked once
            checked_rows(p, self.name, self.vocab_size).checked_distribution = True
        return p


def checked_rows(p, name: str, vocab_size: int):
    """p itself, once its rows are distributions over exactly vocab_size ids (ValueError naming the model)."""
    check_distribution(p, name)
    if p.shape[-1] != vocab_size:  # a wider row would let a sampler emit an id past the vocabulary
        raise ValueError(f"{name}: rows must have vocab_size = {vocab_size} entries, got shape {tuple(p.shape)}")
    return p


def call(impl: Impl, target: LM, draft: LM | None, prompt: list[int], *, gamma: int, max_new_tokens: int,
         rng, eos: int | None = None) -> Generation:
    """Call an implementation under guard and check the promised output."""
    out = guarded_call(impl.fn, target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens, rng=rng,
                       eos=eos, arg_names=("target", "draft", "prompt"), timeout_s=call_limit(impl),
                       owns_torch_rng=impl.caps.rng == "own")
    tokens = list(getattr(out, "tokens", out) if out is not None else [])
    if out is None or not all(isinstance(t, int) and 0 <= t < target.vocab_size for t in tokens):
        raise ContractViolation(f"{impl.name}: returned {out!r}, expected a Generation of token ids")
    if len(tokens) > max_new_tokens or (eos in tokens[:-1]):
        raise ContractViolation(f"{impl.name}: returned {len(tokens)} tokens {tokens} for max_new_tokens="
                                f"{max_new_tokens}, eos={eos}")
    return out if isinstance(out, Generation) else Generation(tokens)
