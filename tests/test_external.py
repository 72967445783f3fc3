"""The third-party adapters (impls/external/): every recorded upstream failure still reproduces with the
library alone, each adapter reads its library's format faithfully, and a missing library makes an adapter
unavailable -- listed, skipped with the reason -- never an import error."""

import importlib.util

import pytest
import torch

from harness.contracts.quantization import dequantize
from harness.registry import KNOWN_FAILURES, get, impls, library_unavailable, load_all, make_impl
from harness.runner import Property

load_all()  # the records are made where the adapters register
RECORDS = sorted(KNOWN_FAILURES.values(), key=lambda r: (r.technique, r.impl, r.property))
REPRODUCTIONS = {r.reproduce: r for r in RECORDS}  # one run per distinct reproduction


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("record", REPRODUCTIONS.values(), ids=[f"{r.impl}:{r.property}" for r in
                                                                 REPRODUCTIONS.values()])
def test_recorded_upstream_failure_still_reproduces(record):
    """Each record's minimal reproduction, which asserts the library's wrong behaviour, runs to its end: once the
    library is fixed it raises, and the record must be updated (the matrix then says `stale` too)."""
    if not installed(record.library):
        pytest.skip(f"{record.library} is not installed (pip install -e '.[external]')")
    exec(compile(record.reproduce, f"<reproduction of {record.impl} / {record.property}>", "exec"), {})


def test_every_record_names_a_registered_adapter_and_a_property_that_applies_to_it():
    """A record on a property its adapter skips could never show: it would hide nothing and prove nothing."""
    from harness.runner import properties_of

    for r in RECORDS:
        impl = get(r.technique, r.impl)
        props = {p.name: p for p in properties_of(r.technique)}
        assert r.property in props, f"{r.impl}: no property {r.property}"
        reason = props[r.property].skip_reason(impl)
        assert reason is None or reason == impl.unavailable, f"{r.impl} / {r.property} is skipped: {reason}"
        assert r.version and r.what and r.reproduce.strip()


@pytest.mark.skipif(not installed("gguf"), reason="gguf is not installed")
@pytest.mark.parametrize(("name", "kind", "bits"), [("gguf_q8_0", "Q8_0", 8), ("gguf_q4_0", "Q4_0", 4)])
def test_gguf_codes_and_scales_dequantize_as_gguf_does(name, kind, bits):
    """The contract's dequantize of the adapter's (codes, scale) is gguf-py's own dequantize of its bytes, bit
    for bit: the adapter unpacks the blocks (float16 d, then the codes; Q4_0's two nibbles) faithfully."""
    import gguf

    w = torch.randn(5, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 5)[:, None]
    qt = get("quantization", name).fn(w, bits=bits, granularity="group", group_size=32)
    kind = gguf.GGMLQuantizationType[kind]
    theirs = gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), kind), kind)
    assert torch.equal(dequantize(qt), torch.from_numpy(theirs))


@pytest.mark.skipif(not installed("torchao"), reason="torchao is not installed")
@pytest.mark.parametrize("granularity", ["tensor", "channel", "group"])
def test_torchao_codes_and_scales_dequantize_as_torchao_does(granularity):
    from torchao.quantization.quant_primitives import dequantize_affine

    w = torch.randn(6, 32, generator=torch.Generator().manual_seed(1))
    size = 8 if granularity == "group" else None
    qt = get("quantization", "torchao_affine").fn(w, bits=8, granularity=granularity, group_size=size)
    block = {"tensor": (6, 32), "channel": (1, 32), "group": (1, 8)}[granularity]
    theirs = dequantize_affine(qt.codes, block, qt.scale, torch.zeros_like(qt.scale, dtype=torch.int32), torch.int8,
                               quant_min=-128, quant_max=127)
    assert torch.allclose(dequantize(qt), theirs, rtol=0, atol=0)


@pytest.mark.skipif(not installed("transformers"), reason="transformers is not installed")
def test_speculative_draws_are_restored_after_the_call():
    """torch.rand_like and torch.multinomial are the harness rng's only inside the routine's call."""
    from harness.lm import TableLM, TorchRng

    rand_like, multinomial = torch.rand_like, torch.multinomial
    table = torch.tensor([[0.5, 0.5], [0.2, 0.8], [0.6, 0.4]], dtype=torch.float64)  # order 1, V = 2
    target, draft = TableLM(table), TableLM(table.flip(-1))
    out = get("speculative", "transformers_speculative_sampling").fn(target, draft, [0], gamma=2, max_new_tokens=4,
                                                                      rng=TorchRng(0))
    assert len(out.tokens) == 4
    assert (torch.rand_like, torch.multinomial) == (rand_like, multinomial)


def test_a_missing_library_makes_an_unavailable_adapter_that_every_property_skips():
    reason = library_unavailable("no_such_library_here", install="pip install no-such-library")
    assert "no_such_library_here is not installed" in reason and "pip install" in reason
    impl = make_impl("quantization", "missing_adapter", lambda w, **kw: None, unavailable=reason)
    assert Property("error_within_half_step", lambda impl: None, "m").skip_reason(impl) == reason
    assert library_unavailable("torch", install="-") == ""


def test_every_adapter_is_registered_with_or_without_its_library():
    """The CUDA-only ones are listed here too, each unavailable or skipped for its device, never missing."""
    names = {i.name for t in ("attention", "quantization", "quantized_linear", "speculative") for i in impls(t)}
    assert {"flash_attn_2", "flashinfer_prefill", "xformers_memory_efficient", "vllm_scaled_int8_quant", "gguf_q8_0",
            "gguf_q4_0", "torchao_affine", "torch_ao_observers", "bnb_int8", "bnb_llm_int8", "transformers_sdpa",
            "transformers_eager", "transformers_speculative_sampling", "torchao_int8_dynamic"} <= names
