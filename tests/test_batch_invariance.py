"""The batch-invariance machinery: fixed-order arithmetic (harness/numerics/fixed_order.py) is bit-identical per row
whatever the batch and unchanged by trailing zeros, and matches torch's results to rounding; the
measurement (harness/engine/batch_invariance.py) reports 0 for an invariant implementation and a deviation for
one whose order follows the batch; the report names what a row's bits vary with."""

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.bench.report.batch_invariance import verdict
from llm_inference_harness.engine.batch_invariance import Comparison, Measured, differs, fixed_specs, measure
from llm_inference_harness.engine.registry import get
from llm_inference_harness.models.gpt import GPT, GPTConfig
from llm_inference_harness.numerics import fixed_order as fo
from llm_inference_harness.strategies.common import generator, seeds

dtypes = st.sampled_from([torch.float32, torch.float64])


@given(n=st.integers(1, 70), zeros=st.integers(1, 70), rows=st.integers(1, 5), seed=seeds, dtype=dtypes)
def test_tree_sum_ignores_trailing_zeros_and_is_a_sum(n, zeros, rows, seed, dtype):
    x = torch.randn(rows, n, generator=generator(seed), dtype=torch.float64).to(dtype)
    total = fo.tree_sum(x)
    assert torch.equal(total, fo.tree_sum(F.pad(x, (0, zeros))))
    assert torch.allclose(total.double(), x.double().sum(-1), rtol=0, atol=n * torch.finfo(dtype).eps * 4)


@given(M=st.integers(1, 9), K=st.integers(1, 40), N=st.integers(1, 9), at=st.integers(0, 8), zeros=st.integers(0, 9),
       seed=seeds, dtype=dtypes)
def test_matmul_and_linear_rows_do_not_depend_on_the_batch(M, K, N, at, zeros, seed, dtype):
    """Row i of a (M, K) @ (K, N) product alone, in the batch, and with zeros appended along K: the same bits."""
    g, at = generator(seed), at % M
    a, b = (torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype) for shape in ((M, K), (K, N)))
    for product in (fo.matmul, lambda a, b: fo.linear(a, b.T)):
        together = product(a, b)
        assert torch.equal(together[at], product(a[at:at + 1], b)[0])
        assert torch.equal(product(F.pad(a, (0, zeros)), F.pad(b, (0, 0, 0, zeros))), together)
        assert torch.allclose(together.double(), a.double() @ b.double(), rtol=0, atol=K * 8 * torch.finfo(dtype).eps)


def test_batch_invariant_mode_makes_a_gpt_row_independent_of_its_batch():
    """In the mode a sequence's logits are the same bits alone and in a batch of 5 (torch's own layers may take
    MKL's GEMV path for one row and a GEMM for five), and within rounding of the plain forward."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=16)).eval()
    idx = torch.randint(0, 11, (5, 7), generator=generator(1))
    with torch.no_grad():
        plain = model(idx)
        with fo.BatchInvariantMode():
            together, alone = model(idx), model(idx[:1])
    assert torch.equal(together[0], alone[0])
    assert torch.allclose(together, plain, atol=1e-5)


def test_differs_is_zero_exactly_for_the_same_bits():
    x = torch.tensor([1.0, -0.0, 3.0])
    assert differs(x, torch.tensor([1.0, 0.0, 3.0])) == 0.0  # torch.equal: the sign of zero is no difference
    assert differs(x, x.nextafter(torch.tensor(9.0))) > 0
    assert differs(x, torch.tensor([1.0, float("nan"), 3.0])) == float("inf")
    assert differs([1, 2], [1, 2]) == 0.0 and differs([1, 2], [2, 1]) == 1.0
    assert Comparison("batch", "", x, x + 1).deviation == 1.0


def test_measure_tells_an_invariant_kernel_from_one_that_splits_for_small_batches():
    names, specs = ("batch_invariant", "mutant_splitk_for_small_batches"), fixed_specs("attention", "float32")[:1]
    invariant, splitting = (measure(get("attention", name), specs) for name in names)
    assert invariant.deviation and max(invariant.deviation.values()) == 0
    assert splitting.deviation["batch"] > 0 and splitting.deviation["rerun"] == 0


def test_verdict_names_what_the_bits_vary_with():
    m = Measured("k", "float32", ("batch_invariant",), {"batch": 0.0, "chunks": 1e-7, "rerun": 0.0, "threads": 0.0})
    assert verdict(m) == "varies with chunks (**declares batch_invariant**); deterministic"
    m.deviation["chunks"] = 0.0
    assert verdict(m) == "invariant in practice; deterministic"
