"""Properties of KV-cache decoding (contract: harness/contracts/kvcache.py).

On tiny random GPTs (1-3 layers, MHA/GQA, learned/rotary positions) and ragged prompts drawn by
Hypothesis: decoding with a cache gives the logits of the full forward pass at every split between
prefill and steps, samples the same tokens as recomputation, treats each sequence of a batch as if it
were alone (also when rows share leading tokens), never lets unused (NaN-filled) slots reach an output,
holds all 32 positions, starts afresh at every prefill, keeps two decoders of one model apart, is left
unchanged by a rejected call at any point of a sequence of calls, and computes GQA exactly as MHA with repeated
kv heads.  These are the decoder protocol's laws; a model running with its own cache (the model protocol) has
properties/test_kvcache_models.py.
"""

import dataclasses
from dataclasses import dataclass

import torch
from hypothesis import event, given
from hypothesis import strategies as st

from llm_inference_harness.contracts import kvcache as contract
from llm_inference_harness.contracts.kvcache import single_threaded
from llm_inference_harness.engine.capabilities import applies, needs_dtype
from llm_inference_harness.engine.guard import assert_rejected
from llm_inference_harness.engine.registry import get
from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY, assert_earned, dtype_of
from llm_inference_harness.references.kvcache import gpt_logits64, gpt_logits_plain
from llm_inference_harness.strategies.kvcache import DecodeCase, decode_cases, relate

TECHNIQUE = "kvcache"
decoder_protocol = contract.speaks("decoder")


def exact_only(impl):
    return None if impl.exact else "approximate: checked against its own tolerance, not sample by sample"


def draw(data, impl, **kw) -> DecodeCase:
    kw.setdefault("dtypes", impl.dtypes)
    return data.draw(decode_cases(**kw), label="case")


def decode(impl, model, case: DecodeCase, prompts=None, steps=None) -> list[torch.Tensor]:
    """Logits (B, V) after prefill, then after every step."""
    prompts = case.prompt_tensors() if prompts is None else prompts
    steps = case.step_tensors() if steps is None else steps
    decoder = contract.make(impl, model, case.max_len)
    out = [contract.prefill(impl, decoder, model, prompts)]
    return out + [contract.step(impl, decoder, model, tokens) for tokens in steps]


@dataclass(frozen=True)
class Forward:
    """The full forward pass of one sequence: float64 truth and the plain computations in the model's dtype
    (for an approximate impl: the forward whose keys/values took the int8 round trip)."""

    kind: str
    truth: torch.Tensor  # (n, V)
    plains: list[torch.Tensor]  # (n, V) each

    def check(self, got: torch.Tensor, first: int, dtype: str, what: str) -> None:
        """got (n, V): logits at positions first, first + 1, ..."""
        assert_earned(got, self.truth[first:], [p[first:] for p in self.plains], dtype_of(dtype), what=what,
                      kind=self.kind)


def forwards(impl, model, seqs: list[torch.Tensor]) -> list[Forward]:
    """Each sequence's Forward, from one batched forward per computation."""
    plains = gpt_logits_plain(model, seqs) if impl.exact else [gpt_logits64(model, seqs, kv_bits=8)]
    return [Forward("forward" if impl.exact else "kv_int8", truth, [p[b] for p in plains])
            for b, truth in enumerate(gpt_logits64(model, seqs))]


@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_prefill_then_steps_equal_forward(impl, data):
    """For every split k: prefill(seq[:k]) then steps over seq[k:] give the full forward's logits."""
    case = draw(data, impl, ragged=False, batch=(1, 2), max_prompt=4, max_steps=3)
    model, seqs = case.model(), case.sequences()
    rows, n = forwards(impl, model, seqs), len(seqs[0])
    for k in range(1, n + 1):
        prompts = [s[:k] for s in seqs]
        steps = [torch.stack([s[t] for s in seqs]) for t in range(k, n)]
        logits = torch.stack(decode(impl, model, case, prompts, steps), dim=1)  # (B, n - k + 1, V)
        for b, forward in enumerate(rows):
            forward.check(logits[b], k - 1, case.dtype, what=f"{impl.name}: row {b}, prefill {k} of {n} tokens")


@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_unused_slots_never_leak(impl, data):
    """With far more capacity than used (max_len up to the block size), the logits stay finite and exact."""
    case = draw(data, impl, batch=(1, 2), max_steps=3, spare=st.integers(8, 32))
    model = case.model()
    rows = forwards(impl, model, case.sequences())  # before the decoder can touch the model
    logits = torch.stack(decode(impl, model, case), dim=1)  # (B, steps + 1, V), finite (checked by the call)
    for b, forward in enumerate(rows):
        forward.check(logits[b], len(case.prompts[b]) - 1, case.dtype, what=f"{impl.name}: row {b}")


@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_long_sequences_cross_cache_blocks(impl, data):
    """Prompts of up to 32 tokens, half the time stepped until the longest holds all the model's 32 positions,
    and half the time sharing row 0's leading tokens: a cache laid out in blocks of 16, sized for the prompt
    plus a few steps, keeping a sliding window, or reusing blocks by their own tokens must still be exact."""
    case = draw(data, impl, batch=(1, 2), max_prompt=32, max_steps=12, fill=True, related=True)
    model = case.model()
    rows = forwards(impl, model, case.sequences())
    logits = torch.stack(decode(impl, model, case), dim=1)  # (B, steps + 1, V)
    for b, forward in enumerate(rows):
        forward.check(logits[b], len(case.prompts[b]) - 1, case.dtype,
                      what=f"{impl.name}: row {b} of {len(forward.truth)} tokens")


def fresh(case: DecodeCase, other: DecodeCase) -> DecodeCase:
    """other's prompts and steps (tokens folded into case's vocabulary) for case's model."""
    in_vocab = lambda rows: tuple(tuple(t % case.vocab for t in row) for row in rows)  # noqa: E731
    return dataclasses.replace(case, prompts=in_vocab(other.prompts), steps=in_vocab(other.steps),
                               max_len=other.max_len)


def assert_same_calls(impl, got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    for t, (g, w) in enumerate(zip(got, want, strict=True)):
        err = (g - w).abs().max().item()
        assert err <= FLOAT64_IDENTITY * max(1.0, w.abs().max().item()), (
            f"{impl.name}: {what}, call {t} differs from a fresh decoder's by {err:.3g}")


@needs_dtype("float64")
@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_every_prefill_starts_a_new_batch(impl, data):
    """prefill drops the previous batch: 2-4 batches (other prompts, maybe another batch size, sometimes
    sharing leading tokens) decoded one after another on one decoder each decode exactly as on a fresh
    decoder (float64).  A cache that keeps, or never frees, an old batch's blocks fails here."""
    first = draw(data, impl, batch=(1, 3), dtypes=("float64",), max_prompt=12, related=True)
    batches = [first]
    for _ in range(data.draw(st.integers(1, 3), label="more")):
        case = fresh(first, draw(data, impl, batch=(1, 3), dtypes=("float64",), max_prompt=12, related=True))
        if data.draw(st.booleans(), label="reuse the first batch's leading tokens"):
            case = dataclasses.replace(case, prompts=data.draw(relate(first.prompts[0], case.prompts, first.vocab)))
        batches.append(case)
    model = first.model()
    decoder = contract.make(impl, model, max(case.max_len for case in batches))
    for n, case in enumerate(batches):
        reused = [contract.prefill(impl, decoder, model, case.prompt_tensors())]
        reused += [contract.step(impl, decoder, model, tokens) for tokens in case.step_tensors()]
        assert_same_calls(impl, reused, decode(impl, model, case), f"batch {n} of {len(batches)} on one decoder")


@needs_dtype("float64")
@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_decoders_on_one_model_are_independent(impl, data):
    """Two decoders made from one model, their prefills and steps interleaved, each decode exactly as if the
    other did not exist (float64): a cache kept on the model object is shared by both."""
    one = draw(data, impl, batch=(1, 2), dtypes=("float64",))
    two = fresh(one, draw(data, impl, batch=(1, 2), dtypes=("float64",)))
    model = one.model()
    decoders = [contract.make(impl, model, case.max_len) for case in (one, two)]
    calls = [[contract.prefill(impl, decoder, model, case.prompt_tensors())]
             for decoder, case in zip(decoders, (one, two), strict=True)]
    steps = [case.step_tensors() for case in (one, two)]
    for t in range(max(map(len, steps))):
        for decoder, tokens, out in zip(decoders, steps, calls, strict=True):
            if t < len(tokens):
                out.append(contract.step(impl, decoder, model, tokens[t]))
    for n, (case, out) in enumerate(zip((one, two), calls, strict=True)):
        assert_same_calls(impl, out, decode(impl, model, case), f"decoder {n} of 2 interleaved on one model")


def assert_rows_decode_alone(impl, case: DecodeCase) -> None:
    model = case.model()
    together = torch.stack(decode(impl, model, case), dim=1)  # (B, steps + 1, V)
    for b, prompt in enumerate(case.prompt_tensors()):
        alone = torch.stack(decode(impl, model, case, [prompt], [s[b : b + 1] for s in case.step_tensors()]), 1)[0]
        err = (together[b] - alone).abs().max().item()
        assert err <= FLOAT64_IDENTITY * max(1.0, alone.abs().max().item()), (
            f"{impl.name}: row {b} (prompt of {len(prompt)} of lengths {[len(p) for p in case.prompts]}) "
            f"differs from decoding it alone by {err:.3g}")


@needs_dtype("float64")
@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_ragged_batch_equals_alone(impl, data):
    """Row b of a batch of ragged prompts decodes exactly as sequence b decoded on its own (float64)."""
    assert_rows_decode_alone(impl, draw(data, impl, batch=(2, 3), dtypes=("float64",)))


@needs_dtype("float64")
@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_rows_sharing_leading_tokens_decode_alone(impl, data):
    """Rows that start with row 0's tokens, or with all but one early token of them, in a model of 2-3 layers,
    each decode exactly as alone (float64).  Layer 0's keys depend on a token and its position only; a
    prefix cache that reuses a block by its own tokens, not by everything before them, is wrong from layer 1."""
    case = draw(data, impl, batch=(2, 3), dtypes=("float64",), max_prompt=16)
    base, *rest = case.prompts
    related = data.draw(relate(base, tuple(rest), case.vocab), label="rows after row 0")
    assert_rows_decode_alone(impl, dataclasses.replace(case, prompts=(base, *related), n_layer=max(2, case.n_layer)))


@needs_dtype("float64")
@applies(exact_only)
@applies(decoder_protocol)
@single_threaded
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_sampling_matches_recompute(impl, data, seed):
    """Sampling with the same seed draws the same tokens as the recompute oracle (float64 models)."""
    case = draw(data, impl, dtypes=("float64",), max_steps=0, spare=st.integers(1, 6))
    model, oracle = case.model(), get("kvcache", "recompute")
    runs = []
    for who in (impl, oracle):
        decoder, gen = contract.make(who, model, case.max_len), torch.Generator().manual_seed(seed)
        logits, drawn = contract.prefill(who, decoder, model, case.prompt_tensors()), []
        for _ in range(case.max_len - max(len(p) for p in case.prompts)):
            drawn.append(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)[:, 0])  # (B,)
            logits = contract.step(who, decoder, model, drawn[-1])
        runs.append(torch.stack(drawn).T.tolist() if drawn else [])
    assert runs[0] == runs[1], f"{impl.name} sampled {runs[0]}, recompute sampled {runs[1]}"


@needs_dtype("float64")
@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_gqa_equals_mha_with_repeated_kv(impl, data):
    """A GQA model decodes exactly as the MHA model whose kv heads are its own, each repeated per group."""
    case = draw(data, impl, gqa=True, dtypes=("float64",))
    gqa = case.model()
    mha = type(gqa)(case.config(n_kv_head=case.n_head)).double().eval()
    state = gqa.state_dict()
    G, d = case.n_head // case.n_kv_head, case.head_dim
    for key, w in state.items():
        if key.endswith("attn.kv.weight"):  # (2 * Hkv * d, D) -> (2 * H * d, D): head j copied to j*G .. j*G+G-1
            state[key] = w.view(2, case.n_kv_head, d, -1).repeat_interleave(G, dim=1).reshape(2 * case.n_head * d, -1)
    mha.load_state_dict(state)
    got, want = (torch.stack(decode(impl, m, case), dim=1) for m in (gqa, mha))
    err = (got - want).abs().max().item()
    assert err <= FLOAT64_IDENTITY * max(1.0, want.abs().max().item()), f"{impl.name}: GQA vs MHA differ by {err:.3g}"


@applies(decoder_protocol)
@single_threaded
def test_bad_input_is_rejected(impl):
    """Empty/2-D/too-long prompts, out-of-vocabulary ids, step before prefill and past max_len raise ValueError."""
    case = DecodeCase(n_layer=1, n_head=2, n_kv_head=1, head_dim=2, positions="rotary", vocab=5,
                      prompts=((1, 2),), steps=(), max_len=3, dtype=impl.dtypes[0], seed=0)
    model = case.model()
    assert_rejected(impl, "max_len past the model's", model, 33, names=("max_len",))
    decoder = contract.make(impl, model, case.max_len)
    assert_rejected(impl, "step before prefill", torch.tensor([1]), method=decoder.step, names=("prefill",))
    for bad in ([], [torch.tensor([[1, 2]])], [torch.tensor([1, 2, 3, 4])], [torch.tensor([9])], [torch.tensor([])]):
        assert_rejected(impl, f"prompts {bad}", bad, method=decoder.prefill, names=("prompts",))
    contract.prefill(impl, decoder, model, [torch.tensor([1, 2])])
    for bad in (torch.tensor([1, 2]), torch.tensor([9]), torch.tensor([[3]])):
        assert_rejected(impl, f"tokens {bad.tolist()}", bad, method=decoder.step, names=("tokens",))
    logits = contract.step(impl, decoder, model, torch.tensor([3]))  # the rejected calls left no trace
    forwards(impl, model, [torch.tensor([1, 2, 3])])[0].check(logits, 2, case.dtype,
                                                              what=f"{impl.name}: the step after three rejected ones")
    assert_rejected(impl, "a step past max_len", torch.tensor([3]), method=decoder.step, names=("max_len",))


def bad_calls(case: DecodeCase, max_len: int, live: list[int] | None) -> dict[str, tuple[str, object, str]]:
    """What a decoder must reject now: kind -> (the method, its argument, the name the error must say).  ``live``:
    the lengths of the batch the decoder holds (None before the first prefill)."""
    v = case.vocab
    calls = {
        "no prompts": ("prefill", [], "prompts"),
        "a 2-D prompt": ("prefill", [torch.tensor([[0, 1]]) % v], "prompts"),
        "a prompt past max_len": ("prefill", [torch.zeros(max_len + 1, dtype=torch.long)], "prompts"),
        "a prompt id past the vocabulary": ("prefill", [torch.tensor([v])], "prompts"),
        "an empty prompt": ("prefill", [torch.tensor([], dtype=torch.long)], "prompts"),
        "int32 prompt ids": ("prefill", [torch.tensor([0], dtype=torch.int32)], "prompts"),
    }
    if live is None:
        return {**calls, "a step before the first prefill": ("step", torch.zeros(1, dtype=torch.long), "prefill")}
    B = len(live)
    calls.update({
        "a step of one row too many": ("step", torch.zeros(B + 1, dtype=torch.long), "tokens"),
        "a 2-D step": ("step", torch.zeros(B, 1, dtype=torch.long), "tokens"),
        "a step id past the vocabulary": ("step", torch.full((B,), v), "tokens"),
        "a negative step id": ("step", torch.full((B,), -1), "tokens"),
    })
    if max(live) == max_len:
        calls["a step past max_len"] = ("step", torch.zeros(B, dtype=torch.long), "max_len")
    return calls


@needs_dtype("float64")
@applies(decoder_protocol)
@single_threaded
@given(data=st.data())
def test_rejected_calls_leave_no_trace(impl, data):
    """1-2 batches decoded one after another on one decoder, and 0-2 rejected calls before any of its calls:
    before the first prefill, right after a prefill, mid-decode, with a row at max_len (a step past it), as a
    prefill while a batch is live (which must keep it), and at least one while a batch is live.  Each raises
    ValueError naming the argument, and every valid call returns exactly what a twin decoder that never saw the
    rejected ones returns (float64); a prefill of the first batch's prompts closes both."""
    first = draw(data, impl, batch=(1, 3), dtypes=("float64",), max_prompt=6, max_steps=3, spare=st.just(0))
    batches = [first] + [fresh(first, draw(data, impl, batch=(1, 3), dtypes=("float64",), max_prompt=6, max_steps=3,
                                             spare=st.just(0)))
                         for _ in range(data.draw(st.integers(0, 1), label="another batch"))]
    max_len = max(c.max_len for c in batches) + data.draw(st.sampled_from([0, 0, 1, 3]), label="spare")
    model = first.model()
    decoder, twin = (contract.make(impl, model, max_len) for _ in range(2))
    calls = [(case, t) for case in batches for t in range(len(case.steps) + 1)]  # t = 0: the prefill
    calls.append((first, 0))  # the closing prefill
    forced = data.draw(st.integers(1, len(calls) - 1), label="the call before which a batch is live and rejected")
    live = None
    for k, (case, t) in enumerate(calls):
        menu = bad_calls(case, max_len, live)
        n = data.draw(st.integers(1 if k == forced else 0, 2), label="rejected calls here")
        kinds = data.draw(st.lists(st.sampled_from(sorted(menu)), min_size=n, max_size=n), label="which")
        if "a step past max_len" in menu and data.draw(st.booleans(), label="a step past max_len too"):
            kinds.append("a step past max_len")  # the one bad call that exists only at the end of a batch
        for kind in kinds:
            method, arg, name = menu[kind]
            assert_rejected(impl, f"{kind}, before call {k} of {len(calls)}", arg,
                            method=getattr(decoder, method), names=(name,))
            event(f"rejected: {kind}")
            event("rejected while a batch is live" if live else "rejected before the first prefill")
            if live and max(live) == max_len:
                event("rejected with a row at max_len")
        if t == 0:
            got, want = (contract.prefill(impl, d, model, case.prompt_tensors()) for d in (decoder, twin))
            live = [len(p) for p in case.prompts]
        else:
            tokens = case.step_tensors()[t - 1]
            got, want = (contract.step(impl, d, model, tokens) for d in (decoder, twin))
            live = [n + 1 for n in live]
        assert_same_calls(impl, [got], [want], f"call {k} of {len(calls)} (after rejected ones)")
