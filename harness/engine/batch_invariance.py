"""Batch invariance and determinism: the comparisons that check them, and what they measure where undeclared.

A serving engine batches requests, and a request's output may then depend on its batch: reduction orders
follow the batch size, split-K starts for small batches, chunked prefill moves tile boundaries.  For each
technique a *comparison* pairs what one row computes in two situations that must give the same bits for an
implementation declaring ``batch_invariant`` (alone / inside a batch of other rows, in a permuted batch, its
queries in chunks, decoded under continuous batching) or ``deterministic`` (a second run, another thread
count).  The properties (properties/test_<technique>_batch.py) assert every comparison is bit-identical
(torch.equal); `measure` takes the largest deviation of each kind over a fixed list of compositions, for
the report's table of every registered implementation (0: invariant in practice).
He et al. 2025, "Defeating Nondeterminism in LLM Inference" (Thinking Machines Lab).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from llm_inference_harness.strategies.batch import (
    AttentionBatch,
    DecodeSchedule,
    LinearBatch,
    PagedBatch,
    SamplerBatch,
    chunks,
)
from llm_inference_harness.strategies.batch import permutation as drawn_permutation

BATCH_KINDS = ("batch", "permutation", "chunks", "continuous")  # what batch_invariant promises
THREADS = (1, 2)  # intra-op thread counts a deterministic implementation must agree across
TECHNIQUES = ("attention", "paged_attention", "kvcache", "quantized_linear", "speculative")


@dataclass(frozen=True)
class Comparison:
    kind: str  # one of BATCH_KINDS, or what deterministic promises: "rerun", "threads"
    what: str  # which row, in which situation
    got: Any  # a tensor, or a sampler's tokens and rounds
    want: Any

    @property
    def deviation(self) -> float:
        return differs(self.got, self.want)


def differs(got: Any, want: Any) -> float:
    """0.0 when got and want hold the same bits (torch.equal; lists compared entry by entry), else the largest
    absolute difference (inf where the shapes differ or only one is NaN; 1.0 for unequal tokens)."""
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
        if torch.equal(got, want):
            return 0.0
        if got.shape != want.shape:
            return float("inf")
        diff = (got.double() - want.double()).abs()
        return float(diff.nan_to_num(nan=float("inf")).max())
    return 0.0 if got == want else 1.0


def assert_same_bits(c: Comparison, name: str) -> None:
    """AssertionError naming the comparison unless it holds the same bits."""
    if isinstance(c.got, torch.Tensor) and isinstance(c.want, torch.Tensor) and c.got.shape == c.want.shape:
        assert torch.equal(c.got, c.want), (
            f"{name}: {c.what} differs from it in {int((c.got != c.want).sum())} of {c.got.numel()} values, "
            f"by up to {c.deviation:.3g} (batch invariance is bit for bit)")
    else:
        assert c.got == c.want, f"{name}: {c.what}: {c.got!r} != {c.want!r}"


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to n inside, restored after (a call must not change it); an implementation
    in a process of its own runs its calls at n threads too (`remote_context`)."""
    from llm_inference_harness.engine.boundary import remote_context

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with remote_context(threads=n):
            yield
    finally:
        torch.set_num_threads(before)


def determinism(run: Callable[[], Any], what: str) -> Iterator[Comparison]:
    """run() twice, then at each other of THREADS intra-op threads: every result must equal the first."""
    now = torch.get_num_threads()
    with threads(now):  # the same count over there as here
        first, again = run(), run()
    yield Comparison("rerun", f"{what}, run again at {now} intra-op thread(s)", again, first)
    for n in (n for n in THREADS if n != now):
        with threads(n):
            yield Comparison("threads", f"{what} at {n} intra-op thread(s)", run(), first)


# --- attention -----------------------------------------------------------------------------------------------
def attention_comparisons(impl, spec: AttentionBatch, kinds=BATCH_KINDS) -> Iterator[Comparison]:
    from llm_inference_harness.contracts.attention import call

    row, kw = spec.row, dict(causal=spec.row.causal, scale=spec.row.scale)
    q1, k1, v1 = spec.alone()
    alone = call(impl, q1, k1, v1, **kw)[0]
    q, k, v = spec.batch()
    if "batch" in kinds:
        yield Comparison("batch", f"row {spec.at} of a batch of {spec.B}", call(impl, q, k, v, **kw)[spec.at], alone)
    if "permutation" in kinds:
        perm = drawn_permutation(spec.B, spec.perm_seed)
        out = call(impl, *(t[perm] for t in (q, k, v)), **kw)
        yield Comparison("permutation", f"row {spec.at} moved to {perm.index(spec.at)} by permuting the batch of "
                                        f"{spec.B} as {perm}", out[perm.index(spec.at)], alone)
    if "chunks" in kinds and spec.cuts:
        parts = []
        for a, b in chunks(row.Nq, spec.cuts):
            n = max(0, b + row.Nk - row.Nq) if row.causal else row.Nk  # the keys the chunk's last query sees
            parts.append(call(impl, q1[:, :, a:b], k1[:, :, :n], v1[:, :, :n], **kw))
        yield Comparison("chunks", f"its {row.Nq} queries in chunks cut at {list(spec.cuts)} (each with the keys "
                                   f"it sees)", torch.cat(parts, dim=2)[0], alone)


def attention_determinism(impl, spec: AttentionBatch) -> Iterator[Comparison]:
    from llm_inference_harness.contracts.attention import call

    q, k, v = spec.batch()
    yield from determinism(lambda: call(impl, q, k, v, causal=spec.row.causal, scale=spec.row.scale),
                           f"a batch of {spec.B}")


# --- paged attention -----------------------------------------------------------------------------------------
def paged_comparisons(impl, spec: PagedBatch, kinds=BATCH_KINDS) -> Iterator[Comparison]:
    from llm_inference_harness.contracts.paged_attention import call

    case, at, kw = spec.case, spec.at, dict(causal=spec.case.causal, scale=spec.case.scale)
    q, k_cache, v_cache, tables, lens = case.paged()
    alone = call(impl, q[at:at + 1], k_cache, v_cache, tables[at:at + 1], lens[at:at + 1], **kw)[0]
    where = f"sequence {at} (of {case.seq_lens[at]} keys) in a batch of lengths {list(case.seq_lens)}"
    if "batch" in kinds:
        yield Comparison("batch", where, call(impl, q, k_cache, v_cache, tables, lens, **kw)[at], alone)
    if "permutation" in kinds:
        perm = drawn_permutation(case.B, spec.perm_seed)
        out = call(impl, q[perm], k_cache, v_cache, tables[perm], lens[perm], **kw)
        yield Comparison("permutation", f"{where}, the batch permuted as {perm}", out[perm.index(at)], alone)
    if "chunks" in kinds and spec.cuts:
        parts = [call(impl, q[at:at + 1, :, a:b], k_cache, v_cache, tables[at:at + 1],
                      lens[at:at + 1] - (case.Nq - b if case.causal else 0), **kw)
                 for a, b in chunks(case.Nq, spec.cuts)]  # causal: each sees the keys up to its last query
        yield Comparison("chunks", f"{where}: its {case.Nq} queries in chunks cut at {list(spec.cuts)} (a chunked "
                                   f"prefill: each chunk sees the keys up to its last query)", torch.cat(parts, 2)[0],
                         alone)


def paged_determinism(impl, spec: PagedBatch) -> Iterator[Comparison]:
    from llm_inference_harness.contracts.paged_attention import call

    args = spec.case.paged()
    yield from determinism(lambda: call(impl, *args, causal=spec.case.causal, scale=spec.case.scale),
                           f"a batch of {spec.case.B} sequences")


# --- KV-cache decoding ---------------------------------------------------------------------------------------
def decode(impl, model, max_len: int, prompts: list[list[int]], steps: list[list[int]]) -> list[torch.Tensor]:
    """Logits (B, V) after the prefill, then after each step (steps[t] holds one token per row)."""
    from llm_inference_harness.contracts import kvcache as contract

    decoder = contract.make(impl, model, max_len)
    out = [contract.prefill(impl, decoder, model, [torch.tensor(p, dtype=torch.long) for p in prompts])]
    return out + [contract.step(impl, decoder, model, torch.tensor(t, dtype=torch.long)) for t in steps]


def decode_comparisons(impl, spec: DecodeSchedule, kinds=BATCH_KINDS) -> Iterator[Comparison]:
    """Row r's logits at each position, from the batch, the permuted batch and every epoch of the schedule,
    against decoding it alone (its prompt prefilled, then stepped token by token)."""
    case, model = spec.case, spec.case.model()
    B, n = len(case.prompts), len(case.steps)
    seqs = [[*p, *(s[r] for s in case.steps)] for r, p in enumerate(case.prompts)]

    @functools.cache
    def alone(r: int) -> torch.Tensor:  # (n + 1, V), decoded when first compared: a failure costs two decodes
        return torch.stack(decode(impl, model, case.max_len, [list(case.prompts[r])],
                                  [[seqs[r][len(case.prompts[r]) + t]] for t in range(n)]))[:, 0]

    lengths = [len(p) for p in case.prompts]
    if "batch" in kinds:
        together = torch.stack(decode(impl, model, case.max_len, [list(p) for p in case.prompts],
                                      [list(s) for s in case.steps]), dim=1)  # (B, n + 1, V)
        for r in range(B):
            yield Comparison("batch", f"row {r} of a batch of prompt lengths {lengths}", together[r], alone(r))
    if "permutation" in kinds:
        perm = drawn_permutation(B, spec.perm_seed)
        permuted = torch.stack(decode(impl, model, case.max_len, [list(case.prompts[r]) for r in perm],
                                      [[s[r] for r in perm] for s in case.steps]), dim=1)  # (B, n + 1, V)
        for r in range(B):
            yield Comparison("permutation", f"row {r} at {perm.index(r)} of the batch permuted as {perm}",
                             permuted[perm.index(r)], alone(r))
    done = [0] * B  # continuation tokens each row has been given
    for e, (rows, steps) in enumerate(spec.epochs if "continuous" in kinds else ()):
        prompts = [seqs[r][:lengths[r] + done[r]] for r in rows]
        out = torch.stack(decode(impl, model, case.max_len, prompts,
                                 [[seqs[r][lengths[r] + done[r] + t] for r in rows] for t in range(steps)]), dim=1)
        for i, r in enumerate(rows):
            yield Comparison("continuous", f"row {r} in epoch {e} of the schedule {list(spec.epochs)} (rows, steps): "
                                           f"re-prefilled with {lengths[r] + done[r]} tokens among rows {list(rows)}, "
                                           f"then {steps} step(s)", out[i], alone(r)[done[r]:done[r] + steps + 1])
            done[r] += steps


def decode_determinism(impl, spec: DecodeSchedule) -> Iterator[Comparison]:
    case, model = spec.case, spec.case.model()
    yield from determinism(lambda: torch.stack(decode(impl, model, case.max_len, [list(p) for p in case.prompts],
                                                      [list(s) for s in case.steps])),
                           f"decoding a batch of {len(case.prompts)}")


# --- quantized linear layers ---------------------------------------------------------------------------------
def linear_comparisons(impl, spec: LinearBatch, kinds=BATCH_KINDS) -> Iterator[Comparison]:
    from llm_inference_harness.contracts.quantized_linear import call

    case, at = spec.case, spec.at
    x, w, calib = case.tensors()
    x = x.reshape(case.n, case.d_in)  # (n, in): the tokens of the batch
    alone = call(impl, x[at:at + 1], w, bits=case.bits, calib=calib)[0]
    what = f"token {at} of {case.n} (outlier columns {list(case.outliers)}, calib {calib is not None})"
    if "batch" in kinds:
        yield Comparison("batch", what, call(impl, x, w, bits=case.bits, calib=calib)[at], alone)
    if "permutation" in kinds:
        perm = drawn_permutation(case.n, spec.perm_seed)
        out = call(impl, x[perm], w, bits=case.bits, calib=calib)
        yield Comparison("permutation", f"{what}, the tokens permuted as {perm}", out[perm.index(at)], alone)


def linear_determinism(impl, spec: LinearBatch) -> Iterator[Comparison]:
    from llm_inference_harness.contracts.quantized_linear import call

    x, w, calib = spec.case.tensors()
    yield from determinism(lambda: call(impl, x, w, bits=spec.case.bits, calib=calib),
                           f"{spec.case.n} tokens")


# --- speculative samplers ------------------------------------------------------------------------------------
def batched_form(impl) -> Callable[..., list]:
    """A sampler's batch form, ``fn.batched(target, draft, prompts, *, gamma, max_new_tokens, rngs, eos=None)
    -> list[Generation]`` (row b drawing only from ``rngs[b]``); TypeError naming it when absent."""
    form = getattr(impl.fn, "batched", None)
    if not callable(form):
        raise TypeError(f"{impl.name}: a sampler declaring batch_invariant provides fn.batched(target, draft, "
                        "prompts, *, gamma, max_new_tokens, rngs, eos=None) -> one Generation per prompt")
    return form


def sampled(out) -> tuple[list[int], list]:
    """A Generation's tokens and rounds (or a plain token list's tokens): what must repeat bit for bit."""
    return list(getattr(out, "tokens", out)), list(getattr(out, "rounds", []))


def sampler_comparisons(impl, spec: SamplerBatch, kinds=BATCH_KINDS) -> Iterator[Comparison]:
    """Row ``at`` of the batch form (each row its own generator) against the single-sequence call with the
    same generator seed: the tokens and rounds must be the same whatever the other rows draw."""
    from llm_inference_harness.contracts.speculative import call
    from llm_inference_harness.engine.guard import call_limit, guarded_call
    from llm_inference_harness.sampling.lm import TorchRng

    case, prompts, form = spec.case, spec.prompts(), batched_form(impl)
    target, draft = case.models()
    kw = dict(gamma=case.gamma, max_new_tokens=case.T, eos=case.eos)
    alone = sampled(call(impl, target, draft, prompts[spec.at], rng=TorchRng(spec.seeds[spec.at]), **kw))

    def batch(order: list[int]) -> list:
        outs = guarded_call(form, target, draft, [prompts[b] for b in order],
                            rngs=[TorchRng(spec.seeds[b]) for b in order], arg_names=("target", "draft", "prompts"),
                            timeout_s=call_limit(impl), hang_owner=impl.fn, **kw)
        return [sampled(o) for o in outs]

    B = len(prompts)
    if "batch" in kinds:
        yield Comparison("batch", f"row {spec.at} of {B} prompts {prompts}", batch(list(range(B)))[spec.at], alone)
    if "permutation" in kinds:
        perm = drawn_permutation(B, spec.perm_seed)
        yield Comparison("permutation", f"row {spec.at} of {B} prompts {prompts} permuted as {perm}",
                         batch(perm)[perm.index(spec.at)], alone)


def sampler_determinism(impl, spec: SamplerBatch) -> Iterator[Comparison]:
    from llm_inference_harness.contracts.speculative import call
    from llm_inference_harness.engine.boundary import remote_context
    from llm_inference_harness.sampling.lm import TorchRng

    case = spec.case
    target, draft = case.models()

    def run():
        # a sampler drawing from torch's own generator gets the same seed each run, here or in its own process
        with torch.random.fork_rng(), remote_context(torch_seed=spec.seeds[0]):
            torch.manual_seed(spec.seeds[0])
            return sampled(call(impl, target, draft, list(case.prompt), gamma=case.gamma, max_new_tokens=case.T,
                                rng=TorchRng(spec.seeds[0]), eos=case.eos))

    yield from determinism(run, f"prompt {list(case.prompt)}")


COMPARISONS = {  # technique -> (batch comparisons, determinism comparisons)
    "attention": (attention_comparisons, attention_determinism),
    "paged_attention": (paged_comparisons, paged_determinism),
    "kvcache": (decode_comparisons, decode_determinism),
    "quantized_linear": (linear_comparisons, linear_determinism),
    "speculative": (sampler_comparisons, sampler_determinism),
}


# --- measurement ---------------------------------------------------------------------------------------------
@dataclass
class Measured:
    """The largest deviation of each kind seen for one implementation (absent: the kind does not apply)."""

    impl: str
    dtype: str
    declared: tuple[str, ...]  # "batch_invariant", "deterministic"
    deviation: dict[str, float] = dataclasses.field(default_factory=dict)
    note: str = ""  # why a kind could not be measured


def fixed_specs(technique: str, dtype: str, device: str = "cpu") -> list:
    """The compositions `measure` runs: a few shapes each of decode, prefill and ragged batches, from fixed
    seeds (deterministic, unlike drawing), small enough to run every implementation in seconds; tensors on
    ``device`` (decoders and samplers run on the CPU)."""
    from llm_inference_harness.strategies.attention import AttentionCase
    from llm_inference_harness.strategies.kvcache import DecodeCase
    from llm_inference_harness.strategies.paged_attention import PagedAttentionCase
    from llm_inference_harness.strategies.quantized_linear import LinearCase
    from llm_inference_harness.strategies.speculative import SpeculativeCase

    if technique == "attention":
        shapes = [(4, 2, 1, 200, 64, True), (2, 2, 40, 40, 32, True), (4, 1, 17, 65, 16, False),
                  (2, 1, 64, 130, 64, True)]  # (H, Hkv, Nq, Nk, d, causal): decode, square prefill, chunk, long
        return [AttentionBatch(AttentionCase(B=1, H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, d=d, causal=c, scale=None,
                                             dtype=dtype, seed=i, device=device),
                               others=tuple((100 + i * 7 + j, m) for j, m in enumerate((1.0, 30.0, 1e-2)[:1 + i])),
                               at=i % (2 + i), perm_seed=i, cuts=tuple(range(1, Nq)) if Nq <= 17 else (Nq // 3,))
                for i, (H, Hkv, Nq, Nk, d, c) in enumerate(shapes)]
    if technique == "paged_attention":
        return [PagedBatch(PagedAttentionCase(B=len(lens), H=4, Hkv=2, Nq=Nq, seq_lens=lens, d=32, block_size=bs,
                                              spare_blocks=1, causal=True, scale=None, dtype=dtype, seed=i,
                                              device=device),
                           at=(i + 1) % len(lens), perm_seed=i, cuts=tuple(range(1, Nq)))
                for i, (lens, Nq, bs) in enumerate([((200, 33, 7), 1, 16), ((40, 90, 12, 64), 5, 8),
                                                    ((130, 130), 3, 32)])]
    if technique == "kvcache":
        def case(i, prompts, steps):
            return DecodeCase(n_layer=2, n_head=4, n_kv_head=2, head_dim=4, positions=("rotary", "learned")[i % 2],
                              vocab=11, prompts=prompts, steps=steps, max_len=24, dtype=dtype, seed=i)
        prompts = ((1, 2, 3, 4, 5, 6, 7), (8, 9), (3, 1, 4, 1, 5))
        steps = ((1, 2, 3), (4, 5, 6), (7, 8, 9), (10, 0, 1))
        return [DecodeSchedule(case(0, prompts, steps), perm_seed=0, epochs=(((0, 1), 2), ((2, 1, 0), 1), ((1,), 1))),
                DecodeSchedule(case(1, prompts[:2], tuple(s[:2] for s in steps)), perm_seed=1,
                               epochs=(((1,), 3), ((0, 1), 1)))]
    if technique == "quantized_linear":
        return [LinearBatch(LinearCase(n=n, d_in=64, d_out=32, bits=8, dtype=dtype, seed=i, outliers=outliers,
                                       zero_tokens=1, calib=calib, device=device), at=i % n, perm_seed=i)
                for i, (n, outliers, calib) in enumerate([(9, (), False), (33, (5,), False), (16, (3, 40), True)])]
    if technique == "speculative":
        return [SamplerBatch(SpeculativeCase(V=4, target_order=2, draft="table", draft_order=1, zeros=0.3, gamma=g,
                                             T=4, prompt=(1, 2), eos=None if i else 3, seed=i),
                             others=((0,), (3, 3, 1), (2,))[: 1 + i], seeds=tuple(range(10 * i, 10 * i + 2 + i)),
                             at=i % (2 + i), perm_seed=i)
                for i, g in enumerate((2, 3))]
    raise KeyError(f"no batch compositions for technique {technique!r}; known: {', '.join(TECHNIQUES)}")


def measure(impl, specs: list | None = None) -> Measured:
    """The largest deviation of every kind over ``specs`` (default `fixed_specs`), in float32 where the
    implementation declares it (else its first dtype); a sampler with no batch form is measured for
    determinism only, and a call that breaks its contract is noted, not raised."""
    from llm_inference_harness.engine.devices import available, unavailable_reason

    dtype = "float32" if "float32" in impl.dtypes else impl.dtypes[0]
    declared = tuple(c for c in ("batch_invariant", "deterministic") if getattr(impl.caps, c))
    result = Measured(impl.name, dtype, declared)
    if why := unavailable_reason(impl):  # a library not installed, or no device of its here
        result.note = why
        return result
    batch, determinism_of = COMPARISONS[impl.technique]
    kinds = [batch, determinism_of]
    if impl.technique == "speculative" and not callable(getattr(impl.fn, "batched", None)):
        result.note, kinds = "one sequence: no batch form", [determinism_of]
    device = available(impl.devices)[0]
    for spec in fixed_specs(impl.technique, dtype, device) if specs is None else specs:
        for comparisons in kinds:
            try:
                for c in comparisons(impl, spec):
                    result.deviation[c.kind] = max(result.deviation.get(c.kind, 0.0), c.deviation)
            except (TypeError, AssertionError) as exc:  # no batch form, or a call that broke its contract
                result.note = result.note or str(exc).splitlines()[0][:200]
    return result


def measure_all(technique: str, *, jobs: int = 1) -> list[Measured]:
    """`measure` for every registered non-mutant implementation of the technique, each in its own child
    (harness/engine/isolation.py: a plugin that crashes or hangs gets a note, not the report)."""
    from llm_inference_harness.engine import isolation
    from llm_inference_harness.engine.registry import get, impls

    names = [i.name for i in impls(technique)]

    def job(name: str) -> Callable[[], None]:
        return lambda: isolation.send("measured", measure(get(technique, name)))

    outcomes = isolation.run_all([(n, job(n)) for n in names], workers=jobs)
    results = []
    for name in names:
        outcome = outcomes[name]
        found = list(isolation.events(outcome, "measured"))
        if found:
            results.append(found[0])
        else:
            impl = get(technique, name)
            results.append(Measured(name, "", tuple(c for c in ("batch_invariant", "deterministic")
                                                    if getattr(impl.caps, c)), note=outcome.stopped or "no result"))
    return results
