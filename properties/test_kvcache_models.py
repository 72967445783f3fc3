"""Properties of a model running with its own KV cache: the model protocol of harness/contracts/kvcache.py.

Over (model, cache) pairs -- transformers' Llama, Mistral, GPT-2 and Gemma-2 with the dynamic, static,
sliding-window and fp8 caches transformers offers on CPU (impls/external/transformers_kv.py), or a plugin's own
model -- and ragged prompts drawn by Hypothesis, left-padded as transformers pads them: a prefill then steps (or
multi-token chunks) equal the model's own float64 full forward at every split point; each row of a left-padded
batch equals its sequence alone; slots holding a pad or nothing yet, poisoned, never reach a logit; two caches of
one model stay apart; a rejected call at any point of a decode leaves the cache as it was; greedy and seeded
sampling draw the oracle's tokens; sequences run past the sliding window several times, or fill the cache.
Every logit of every real token is compared, within the earned tolerance of the model's dtype
(harness/engine/tolerance.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st

from llm_inference_harness.contracts import kvcache as contract
from llm_inference_harness.contracts.kvcache import single_threaded
from llm_inference_harness.engine.capabilities import applies, needs_cap
from llm_inference_harness.engine.guard import ContractViolation, assert_rejected, call_limit, guarded_call
from llm_inference_harness.engine.tolerance import assert_earned, dtype_of, earned_bound
from llm_inference_harness.references.kvcache import KV_FORMATS, lm_forward
from llm_inference_harness.strategies.kvcache import ModelCase, model_cases, model_seeds

TECHNIQUE = "kvcache"
model_protocol = contract.speaks("model")
# What a poisoned slot's values are set to: finite (a correct mask gives such a slot weight exactly 0, and 0 times
# a finite value is 0, where 0 x NaN would poison even correct attention), and large enough that a slot read with
# any weight above ~1e-9 moves a logit past every earned bound.
POISON = 1e4
# A transformers model call costs ~3 ms of Python whatever its size, and every (architecture, cache) pair is judged:
# these properties run half the loaded profile's examples (15 in ci, 200 in thorough; the profile is loaded before
# property modules are imported: conftest.py, the CLI, the pytest plugin).  No explain phase: on a failure it
# replays hundreds of variations of the minimal example (84 s of a failing property's 101 s), where the shrunk
# counterexample and its reproduce line already say what failed.
EXAMPLES = settings(max_examples=max(10, settings().max_examples // 2),
                    phases=[p for p in settings().phases if p != Phase.explain])


def judged(impl) -> str | None:
    if impl.exact or impl.caps.kv_format in KV_FORMATS:
        return None
    return "approximate, but declares no kv_format whose rounding would earn its tolerance"


def exact_only(impl) -> str | None:
    return None if impl.exact else "approximate: its logits are held to a tolerance, its samples are not compared"


@dataclass
class Setup:
    """An implementation's model for one (dtype, seed), its float64 oracle and the plain computations, built once."""

    impl: object
    dtype: str
    lm: object
    truth: object  # lm.in_float64(): the oracle's model
    plains: list  # models whose full forwards earn the tolerance: lm itself, or float64 ones rounding k and v
    kind: str  # the tolerance row
    weights: dict = field(default_factory=dict)  # lm.module's state when built
    forwards: OrderedDict = field(default_factory=OrderedDict)

    def forward(self, seq: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The float64 truth (n, V) of a whole sequence and the plain logits that earn the bound."""
        key = tuple(seq.tolist())
        if key not in self.forwards:
            call = lambda lm: guarded_call(lm_forward, lm, seq, timeout_s=call_limit(self.impl),  # noqa: E731
                                           hang_owner=self.impl.fn)
            self.forwards[key] = (call(self.truth).double(), [call(p) for p in self.plains])
            while len(self.forwards) > 64:
                self.forwards.popitem(last=False)
        return self.forwards[key]

    def check(self, got: torch.Tensor, seq: torch.Tensor, what: str) -> None:
        """got (n, V): the logits of every token of seq, from its first."""
        truth, plains = self.forward(seq)
        assert_earned(got, truth, plains, dtype_of(self.dtype), what=f"{self.impl.name}: {what}", kind=self.kind)

    def unchanged(self) -> None:
        module = getattr(self.lm, "module", None)
        for name, t in (module.state_dict().items() if module is not None else ()):
            if not torch.equal(self.weights[name], t):
                raise ContractViolation(f"{self.impl.name} changed its model's {name} (the weights must be left as "
                                        "they are)")


_SETUPS: OrderedDict = OrderedDict()


def setup(data, impl) -> Setup:
    dtype, seed = data.draw(st.sampled_from(impl.dtypes), label="dtype"), data.draw(model_seeds, label="seed")
    key = (impl.name, impl.source, dtype, seed)
    if key not in _SETUPS:
        lm = contract.build_lm(impl, dtype_of(dtype), seed)
        check_protocol(impl, lm, dtype_of(dtype))
        in64 = lambda *rt: guarded_call(lm.in_float64, *rt, timeout_s=call_limit(impl), hang_owner=impl.fn)  # noqa
        kind, roundtrips = ("forward", ()) if impl.exact else KV_FORMATS[impl.caps.kv_format]
        plains = [lm] if impl.exact else [in64(rt) for rt in roundtrips]
        module = getattr(lm, "module", None)
        weights = {k: t.clone() for k, t in module.state_dict().items()} if module is not None else {}
        _SETUPS[key] = Setup(impl, dtype, lm, in64(), plains, kind, weights)
        while len(_SETUPS) > 16:
            _SETUPS.popitem(last=False)
    return _SETUPS[key]


def check_protocol(impl, lm, dtype: torch.dtype) -> None:
    for name, kinds in (("vocab_size", int), ("max_positions", int), ("dtype", torch.dtype),
                        ("sliding_window", (int, type(None)))):
        if not isinstance(getattr(lm, name, None), kinds):
            raise ContractViolation(f"{impl.name}: the model's {name} is {getattr(lm, name, 'missing')!r} (the model "
                                    "protocol of harness/contracts/kvcache.py)")
    if lm.dtype != dtype:
        raise ContractViolation(f"{impl.name}: asked for {dtype}, built a model in {lm.dtype}")


class Decoding:
    """One cache of a model fed a case: the left-padded prompts first, then its chunks; every real token's logits
    kept per row.  ``poison``: after each call, every slot holding no real token is filled (lm.poison)."""

    def __init__(self, impl, lm, case: ModelCase, poison: float | None = None) -> None:
        self.impl, self.lm, self.case, self.poison, self.fed = impl, lm, case, poison, 0
        self.chunks = list(case.chunks)  # what is left to feed grows when a sampler appends its tokens
        self.cache = contract.new_cache(impl, lm, case.batch, case.max_len)
        self.tokens, self.mask, self.positions = contract.left_pad([torch.tensor(p) for p in case.prompts], case.pad)
        self.rows: list[torch.Tensor] | None = None

    @property
    def done(self) -> bool:
        return self.fed > len(self.chunks)

    def next_call(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The (tokens, mask, positions) of the next call: the prefill, or the next chunk."""
        if self.rows is None:
            return self.tokens, self.mask, self.positions
        chunk = torch.tensor(self.chunks[self.fed - 1])  # (B, n)
        B, n = chunk.shape
        mask = torch.cat([self.mask, torch.ones(B, n, dtype=torch.long)], dim=1)  # (B, S + n)
        return chunk, mask, self.positions[:, -1:] + 1 + torch.arange(n)  # positions (B, n)

    def feed(self) -> None:
        tokens, mask, positions = self.next_call()
        logits, self.cache = contract.call_lm(self.impl, self.lm, tokens, mask, positions, self.cache)
        if self.rows is None:
            self.rows = [logits[b, -len(p):] for b, p in enumerate(self.case.prompts)]  # (n_b, V): real tokens
        else:
            self.rows = [torch.cat([r, logits[b]]) for b, r in enumerate(self.rows)]
        self.mask, self.positions, self.fed = mask, positions, self.fed + 1
        if self.poison is not None:
            guarded_call(self.lm.poison, self.cache, mask.bool(), self.poison, timeout_s=call_limit(self.impl),
                         hang_owner=self.impl.fn)

    def run(self) -> list[torch.Tensor]:
        while not self.done:
            self.feed()
        return self.rows


def check_rows(s: Setup, case: ModelCase, rows: list[torch.Tensor], what: str) -> None:
    lengths = [len(p) for p in case.prompts]
    for b, seq in enumerate(case.sequences()):
        s.check(rows[b], seq, what=f"{what}: row {b} of prompts {lengths}, {len(seq)} tokens")
    if len(set(lengths)) > 1:
        event("left pads in the batch")


def draw_case(data, s: Setup, **kw) -> ModelCase:
    kw.setdefault("room", s.lm.max_positions)
    return data.draw(model_cases(s.lm.vocab_size, **kw), label="case")


@applies(judged)
@applies(model_protocol)
@single_threaded
@EXAMPLES
@given(data=st.data())
def test_model_prefill_then_steps_equal_forward(impl, data):
    """For every split k of 2-5 tokens (1-2 rows): a prefill of the first k, then the rest in steps or chunks of
    2-3, give the float64 full forward's logits at every token, the prompt's included."""
    s = setup(data, impl)
    n, B = data.draw(st.integers(2, 5), label="tokens"), data.draw(st.integers(1, 2), label="rows")
    tokens = st.integers(0, s.lm.vocab_size - 1)
    seqs = [data.draw(st.lists(tokens, min_size=n, max_size=n), label=f"row {b}") for b in range(B)]
    for k in range(1, n + 1):
        cuts, at = [], k
        while at < n:
            step = min(n - at, data.draw(st.sampled_from([1, 1, 2, 3]), label="chunk"))
            cuts.append((at, at + step))
            at += step
        case = ModelCase(prompts=tuple(tuple(q[:k]) for q in seqs),
                         chunks=tuple(tuple(tuple(q[i:j]) for q in seqs) for i, j in cuts), pad=0,
                         spare=data.draw(st.integers(0, 2), label="spare"))
        check_rows(s, case, Decoding(impl, s.lm, case).run(), f"prefill {k} of {n}, then chunks {cuts}")
    s.unchanged()


@applies(judged)
@applies(model_protocol)
@single_threaded
@EXAMPLES
@given(data=st.data())
def test_model_left_padded_batch_equals_alone(impl, data):
    """2-3 ragged prompts, left-padded with a random token as transformers pads them, then steps and chunks: each
    row's logits are its sequence's own full forward (positions count real tokens; pads are never attended)."""
    s = setup(data, impl)
    case = draw_case(data, s, batch=(2, 3), chunk=3)
    check_rows(s, case, Decoding(impl, s.lm, case).run(), "left-padded batch")
    s.unchanged()


@applies(judged)
@needs_cap("poisons", "the property poisons the slots that hold no real token through lm.poison")
@applies(model_protocol)
@single_threaded
@EXAMPLES
@given(data=st.data())
def test_model_padded_and_unused_slots_never_leak(impl, data):
    """After every call, each slot holding a left pad or nothing yet gets keys 0 and values 1e4, with 4-24 slots
    of the cache never used: the logits stay those of the full forward (a slot read with any weight shows)."""
    s = setup(data, impl)
    case = draw_case(data, s, batch=(1, 3), chunk=2, spare=st.integers(4, 24))
    check_rows(s, case, Decoding(impl, s.lm, case, poison=POISON).run(), "poisoned pads and unused slots")
    s.unchanged()


@applies(judged)
@applies(model_protocol)
@single_threaded
@EXAMPLES
@given(data=st.data())
def test_model_caches_on_one_model_stay_apart(impl, data):
    """Two caches of one model, their calls interleaved in a drawn order, each decode as if alone: a cache kept
    on the model (or a layer's buffer shared between cache objects) mixes them."""
    s = setup(data, impl)
    one, two = (Decoding(impl, s.lm, draw_case(data, s, batch=(1, 2), chunk=2)) for _ in range(2))
    while not (one.done and two.done):
        pick = data.draw(st.booleans(), label="which cache calls next") if not (one.done or two.done) else one.done
        (two if pick else one).feed()
    for n, d in enumerate((one, two)):
        check_rows(s, d.case, d.rows, f"cache {n} of 2 interleaved on one model")
    s.unchanged()


def bad_calls(d: Decoding, vocab: int, max_positions: int) -> dict[str, tuple[tuple, tuple[str, ...]]]:
    """Calls the model must reject at this point of the decode: (arguments, the names one of which the error
    must say), each otherwise the valid next call."""
    tokens, mask, positions = d.next_call()
    B, T = tokens.shape
    past = d.case.max_len - (mask.shape[1] - T) + 1  # a chunk one token longer than the slots left
    wide = torch.zeros(B, past, dtype=torch.long)
    cases = {
        "an id past the vocabulary": (tokens.clone().index_fill_(1, torch.tensor([T - 1]), vocab), ("tokens",)),
        "a negative id": (tokens.clone().index_fill_(1, torch.tensor([0]), -1), ("tokens",)),
        "int32 tokens": (tokens.int(), ("tokens",)),
        "one row too many": (torch.cat([tokens, tokens[:1]]), ("tokens",)),
        "a mask one slot short": (mask[:, 1:], ("mask",)),
        "a mask one slot long": (torch.cat([torch.ones(B, 1, dtype=torch.long), mask], dim=1), ("mask",)),
        "a pad as the last slot": (mask.clone().index_fill_(1, torch.tensor([mask.shape[1] - 1]), 0), ("mask",)),
        "positions of another shape": (positions[:, :, None], ("positions",)),
        "a position past max_positions": (positions.clone().fill_(max_positions), ("positions",)),
        "more slots than max_len": ((wide, torch.cat([mask[:, : mask.shape[1] - T], torch.ones_like(wide)], 1),
                                     positions[:, :1] + torch.arange(past)), ("max_len",)),
    }
    at = {"tokens": 0, "mask": 1, "positions": 2}
    calls = {}
    for what, (bad, names) in cases.items():
        args = list(bad) if what == "more slots than max_len" else [tokens, mask, positions]
        if what != "more slots than max_len":
            args[at[names[0]]] = bad
        calls[what] = (tuple(args), names)
    return calls


@applies(judged)
@applies(model_protocol)
@single_threaded
@EXAMPLES
@given(data=st.data())
def test_model_rejected_calls_leave_the_cache_as_it_was(impl, data):
    """Before any call of a decode -- the prefill, a step, a chunk, the call that fills the cache -- 0-2 bad calls
    (an id outside the vocabulary, a mask or positions of the wrong shape, more slots than max_len, ...) each
    raise ValueError/TypeError naming the argument; at least one comes after the prefill.  The decode then goes
    on as if they never happened: every later logit is the full forward's.  new_cache rejects batch 0 and a
    max_len past max_positions."""
    s = setup(data, impl)
    case = draw_case(data, s, batch=(1, 3), chunk=2, prompt=(1, 6), fed=(1, 5), spare=st.integers(0, 2))
    for bad, name in (((0, 4), "batch"), ((1, s.lm.max_positions + 1), "max_len")):
        assert_rejected(impl, f"new_cache{bad}", *bad, method=s.lm.new_cache, names=(name,))
    d = Decoding(impl, s.lm, case)
    calls = len(case.chunks) + 1
    forced = data.draw(st.integers(1, calls - 1), label="a rejection after the prefill")
    while not d.done:
        menu = bad_calls(d, s.lm.vocab_size, s.lm.max_positions)
        n = data.draw(st.integers(1 if d.fed == forced else 0, 2), label="bad calls here")
        for what in data.draw(st.lists(st.sampled_from(sorted(menu)), min_size=n, max_size=n), label="which"):
            args, names = menu[what]
            assert_rejected(impl, f"{what}, before call {d.fed} of {calls}", *args, d.cache, method=s.lm,
                            names=names)
            event(f"rejected: {what}")
            event("rejected after the prefill" if d.fed else "rejected before the prefill")
            if d.fed == calls - 1 and case.spare == 0:
                event("rejected before the call that fills the cache")
        d.feed()
    check_rows(s, case, d.rows, "after rejected calls")
    s.unchanged()


def choose(logits: torch.Tensor, u: float | None) -> int:
    """Greedy (u None) or inverse-CDF sampling at u of a row's next-token logits (V,)."""
    if u is None:
        return int(logits.argmax())
    cdf = torch.softmax(logits.double(), dim=-1).cumsum(dim=-1)  # (V,)
    return min(int((cdf <= u).sum()), len(cdf) - 1)


def ambiguous(truth: torch.Tensor, u: float | None, bound: float) -> bool:
    """Whether logits within ``bound`` of the oracle's ``truth`` (V,) may choose another token: the top two within
    2 bound (greedy), or u within 2 bound of a CDF step (a softmax moves by at most 2x the largest logit change)."""
    if u is None:
        top = truth.topk(2).values
        return bool(top[0] - top[1] <= 2 * bound)
    cdf = torch.softmax(truth, dim=-1).cumsum(dim=-1)
    return bool(((cdf - u).abs() <= 2 * bound).any())


@applies(exact_only)
@applies(model_protocol)
@single_threaded
@EXAMPLES
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_model_sampling_equals_the_oracle(impl, data, seed):
    """Greedy decoding, or sampling with uniforms from a seeded generator, through the cache chooses at every step
    the token the float64 full forward chooses -- unless the oracle's own choice is within the earned bound of a
    tie, where any correct cache may differ (counted as an event, and that row compared no further).  The oracle
    reads each row's final sequence once: its logits at position t are its choice after the first t + 1 tokens."""
    s = setup(data, impl)
    case = draw_case(data, s, batch=(1, 2), fed=(0, 0), spare=st.integers(1, 5))
    greedy = data.draw(st.booleans(), label="greedy")
    g = torch.Generator().manual_seed(seed)
    d = Decoding(impl, s.lm, case)
    d.feed()
    drawn = []  # per step: each row's uniform (None: greedy) and the token the cache's logits chose
    for t in range(case.spare):
        us = [None if greedy else float(u) for u in torch.rand(case.batch, generator=g, dtype=torch.float64)]
        drawn.append([(u, choose(row[-1], u)) for row, u in zip(d.rows, us, strict=True)])
        if t + 1 < case.spare:
            d.chunks.append(tuple((token,) for _, token in drawn[-1]))
            d.feed()
    for b, prompt in enumerate(case.prompts):
        seq = torch.tensor([*prompt, *(step[b][1] for step in drawn)])
        truth, plains = s.forward(seq)
        for t, step in enumerate(drawn):
            (u, got), at = step[b], len(prompt) - 1 + t
            bound = earned_bound(truth[at], [p[at] for p in plains], dtype_of(s.dtype), s.kind)
            if ambiguous(truth[at], u, bound):
                event("a near tie ended a row's comparison")
                break
            want = choose(truth[at], u)
            assert got == want, (f"{impl.name}: row {b} after {seq[: at + 1].tolist()} chose {got} through the cache; "
                                 f"the full forward chooses {want} ({'greedy' if greedy else f'u = {u:.6f}'})")
    s.unchanged()


@applies(judged)
@applies(model_protocol)
@single_threaded
@EXAMPLES
@given(data=st.data())
def test_model_long_sequences_past_the_sliding_window(impl, data):
    """Prompts up to the model's whole context, or (with a sliding window W) prompts ending at W - 1, W, W + 1,
    2W - 1, ... followed by 2W + 2 or more tokens in steps and chunks, so every row passes the window several
    times and a cache's eviction shows; half the time the cache is exactly full at the end."""
    s = setup(data, impl)
    window = s.lm.sliding_window
    case = draw_case(data, s, batch=(1, 2), prompt=(1, s.lm.max_positions), fed=(0, 10), chunk=3, window=window,
                     spare=st.sampled_from([0, 0, 1, 2]))
    if window is not None and max(map(len, case.sequences())) > 2 * window:
        event("a row past twice the sliding window")
    if case.spare == 0:
        event("the cache exactly full")
    check_rows(s, case, Decoding(impl, s.lm, case).run(), f"window {window}, max_len {case.max_len}")
    s.unchanged()
