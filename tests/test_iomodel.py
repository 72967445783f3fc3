"""Properties of the IO model (harness/analytic/iomodel.py): the twins compute attention and move exactly
the paper's number of elements between HBM and SRAM, never holding more than M on chip.

Traffic is counted by running the twins; the closed forms are separate functions, and the hand-worked
worked numbers (Dao et al. 2022 and the issue's exercise) are compared with what the code computes.
"""

import math

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from llm_inference_harness.analytic.iomodel import (
    Memory,
    SramOverflow,
    causal_blocks,
    fa1_io,
    fa1_paper_blocks,
    fa1_sram,
    fa1_traffic,
    fa2_io,
    fa2_sram,
    fa2_traffic,
    fitting_blocks,
    savings,
    standard_io,
    standard_traffic,
)
from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.references.attention import attention64
from llm_inference_harness.strategies.common import seeds
from llm_inference_harness.strategies.iomodel import IOCase, io_cases, sram_capacities


def reference(Q, K, V, causal=False):
    """One head's float64 attention from the shared oracle: (N, d) -> (1, 1, N, d) and back."""
    return attention64(Q[None, None], K[None, None], V[None, None], causal=causal)[0, 0]


def assert_attention(out, Q, K, V, causal=False, what=""):
    err = (out - reference(Q, K, V, causal)).abs().max().item() if out.numel() else 0.0
    assert err <= 1e3 * FLOAT64_IDENTITY, f"{what} twin is off the float64 reference by {err:.3g}"


@given(case=io_cases(), causal=st.booleans())
def test_standard_twin_moves_4N2_plus_4Nd(case, causal):
    Q, K, V = case.tensors()
    O, io = standard_io(Q, K, V, Memory(), causal=causal)  # noqa: E741 - paper notation
    assert_attention(O, Q, K, V, causal, "standard")
    assert io.traffic == standard_traffic(case.Nq, case.Nk, case.d)
    if case.Nq == case.Nk:
        N, d = case.Nq, case.d
        assert io.traffic == 4 * N * N + 4 * N * d, f"standard attention moved {io.traffic}, not 4N^2 + 4Nd"


def causal_visits(Nq: int, Nk: int, Br: int, Bc: int) -> tuple[int, int]:
    """(key blocks, keys) a causal FA-2 loads over all query blocks: those up to the block holding its last
    row's last visible key (bottom-right alignment), none for a query block whose rows see no key."""
    blocks = keys = 0
    for i0 in range(0, Nq, Br):
        last_key = min(i0 + Br, Nq) - 1 + Nk - Nq
        n = 0 if last_key < 0 else min(-(-Nk // Bc), last_key // Bc + 1)
        blocks, keys = blocks + n, keys + min(Nk, n * Bc)
    return blocks, keys


@given(case=io_cases(), causal=st.booleans())
@example(case=IOCase(Nq=5, Nk=3, d=2, Br=2, Bc=2, seed=0), causal=True)  # rows that see no key
@example(case=IOCase(Nq=7, Nk=3, d=2, Br=2, Bc=1, seed=0), causal=True)  # review: skip offset max(Nk - Nq, 0)
def test_fa2_twin_traffic_is_closed_form(case, causal):
    """FA-2 order: Nd (Q) + 2Nd * ceil(N/Br) (K, V per query block) + Nd (O) + N (L), O written once; causal:
    K and V of the visited key blocks only, counted here by `causal_visits`.  L is the logsumexp of the
    scaled (masked) scores, what the backward recomputes P from."""
    Q, K, V = case.tensors()
    O, L, io = fa2_io(Q, K, V, Memory(), Br=case.Br, Bc=case.Bc, causal=causal)  # noqa: E741 - paper notation
    assert_attention(O, Q, K, V, causal, "FA-2")
    S = Q @ K.T / math.sqrt(case.d)  # (Nq, Nk)
    if causal:
        i, j = torch.arange(case.Nq)[:, None], torch.arange(case.Nk)[None, :]
        S = S.masked_fill(j > i + case.Nk - case.Nq, float("-inf"))
    assert torch.allclose(L, torch.logsumexp(S, dim=-1), rtol=0, atol=1e3 * FLOAT64_IDENTITY), "L is not logsumexp"
    assert io.writes == case.Nq * case.d + case.Nq, "FA-2 must write O and L exactly once"
    if not causal:
        assert io.traffic == fa2_traffic(case.Nq, case.Nk, case.d, case.Br)
        N, d, Br = case.Nq, case.d, case.Br
        if case.Nq == case.Nk and N % Br == 0:
            assert io.traffic == N * d + 2 * N * d * (N // Br) + N * d + N
    else:
        blocks, keys = causal_visits(case.Nq, case.Nk, case.Br, case.Bc)
        assert (io.blocks, io.traffic) == (blocks, 2 * case.Nq * case.d + case.Nq + 2 * case.d * keys)


@given(N=st.integers(1, 48), d=st.integers(1, 24), seed=seeds, data=st.data())
def test_fa1_twin_with_the_papers_blocks(N, d, seed, data):
    """Algorithm 1 with Bc = ceil(M/4d), Br = min(ceil(M/4d), d): traffic is the closed form, and the
    paper's sizes stay within 5M/4 + 11d of SRAM (they ignore S and the rounding, so may exceed M)."""
    M = data.draw(sram_capacities(d), label="M")
    Br, Bc = fa1_paper_blocks(M, d)
    Q, K, V = IOCase(N, N, d, Br, Bc, seed).tensors()
    O, io = fa1_io(Q, K, V, Memory(), Br=Br, Bc=Bc)  # noqa: E741 - paper notation
    assert_attention(O, Q, K, V, what="FA-1")
    assert io.traffic == fa1_traffic(N, N, d, Bc)
    assert io.peak_sram == fa1_sram(min(Br, N), min(Bc, N), d)
    assert io.peak_sram <= 5 * M / 4 + 11 * d


@given(N=st.integers(1, 24), Nk=st.integers(1, 24), d=st.integers(1, 6), Br=st.integers(1, 10),
       Bc=st.integers(1, 10))
def test_fa1_twin_traffic_is_algorithm_1(N, Nk, d, Br, Bc):
    """Algorithm 1 counted line by line, with Nk != N: O, l, m initialised in HBM (line 2) and written back
    after every key block (line 12-13); K, V read once (line 6); Q, O, l, m read per key block (line 8)."""
    io = fa1_io(*IOCase(N, Nk, d, Br, Bc, 0).tensors(), Memory(), Br=Br, Bc=Bc)[-1]
    Tc = -(-Nk // Bc)
    assert (io.writes, io.reads) == ((N * d + 2 * N) * (1 + Tc), 2 * Nk * d + Tc * (2 * N * d + 2 * N))
    assert io.traffic == fa1_traffic(N, Nk, d, Bc)


def test_fa1_paper_blocks_round_up():
    """Bc = ceil(M / 4d), Br = min(Bc, d): M = 1000 gives ceil(15.6) = 16 at d = 16, ceil(31.25) = 32 at d = 8."""
    assert (fa1_paper_blocks(1000, 16), fa1_paper_blocks(1000, 8)) == ((16, 16), (8, 32))


def test_fitting_blocks_fill_the_sram_exactly():
    """An M that is exactly a tile's footprint fits that tile, not the next smaller one (random M rarely lands
    on a footprint, so these are enumerated)."""
    for d in range(1, 9):
        for b in range(1, 20):
            assert fitting_blocks(fa2_sram(b, b, d), d, "fa2") == (b, b)
            assert fitting_blocks(fa1_sram(min(b, d), b, d), d, "fa1") == (min(b, d), b)


@given(N=st.integers(1, 48), d=st.integers(1, 24), seed=seeds, loop=st.sampled_from(["fa1", "fa2"]), data=st.data())
def test_peak_sram_never_exceeds_M(N, d, seed, loop, data):
    """With the largest blocks that fit, the twin runs inside an SRAM of capacity M; one row or
    column more and the same Memory refuses (the capacity check is live)."""
    M = data.draw(sram_capacities(d), label="M")
    Br, Bc = fitting_blocks(M, d, loop)
    Q, K, V = IOCase(N, N, d, Br, Bc, seed).tensors()
    run = (lambda Br, Bc, mem: fa1_io(Q, K, V, mem, Br=Br, Bc=Bc)) if loop == "fa1" else (
        lambda Br, Bc, mem: fa2_io(Q, K, V, mem, Br=Br, Bc=Bc))
    io = run(Br, Bc, Memory(capacity=M))[-1]  # a Memory of capacity M raises the moment it would hold more
    footprint = fa1_sram if loop == "fa1" else fa2_sram
    assert io.peak_sram == footprint(min(Br, N), min(Bc, N), d)
    if Bc < N:  # a bigger key block must not fit
        bigger = (min(Bc + 1, d), Bc + 1) if loop == "fa1" else (Bc + 1, Bc + 1)
        try:
            run(*bigger, Memory(capacity=M))
        except SramOverflow:
            pass
        else:
            raise AssertionError(f"{loop} blocks {bigger} ran inside M = {M} although they do not fit")


@given(T=st.integers(1, 12), B=st.integers(1, 12), d=st.integers(1, 8), seed=seeds)
def test_causal_skipping_visits_T_T_plus_1_over_2_blocks(T, B, d, seed):
    Q, K, V = IOCase(T * B, T * B, d, B, B, seed).tensors()
    O, _, io = fa2_io(Q, K, V, Memory(), Br=B, Bc=B, causal=True)  # noqa: E741 - paper notation
    assert_attention(O, Q, K, V, causal=True, what="causal FA-2")
    assert io.blocks == causal_blocks(T * B, B) == T * (T + 1) // 2
    assert fa2_io(Q, K, V, Memory(), Br=B, Bc=B)[-1].blocks == T * T


@given(T=st.integers(1, 12), B=st.integers(1, 12), short=st.integers(0, 11))
def test_causal_blocks_of_a_ragged_length(T, B, short):
    """causal_blocks(N, B) for N not a multiple of B is the blocks the causal twin visits."""
    N = max(1, T * B - short % B)
    Q, K, V = IOCase(N, N, 1, B, B, 0).tensors()
    assert fa2_io(Q, K, V, Memory(), Br=B, Bc=B, causal=True)[-1].blocks == causal_blocks(N, B)


def test_seeds_exercise_N4096_d128_Br128():
    """The worked exercise: standard 69,206,016 elements vs FA-2 34,607,104 (2.0x), both counted by
    running the twins at that size on the meta device (shapes only, no arithmetic).  FA-2 traffic
    does not depend on Bc (test_fa2_twin_traffic_is_closed_form), so large key blocks keep this fast."""
    N, d, Br = 4096, 128, 128
    Q, K, V = (torch.empty(N, d, device="meta") for _ in range(3))
    fa2 = fa2_io(Q, K, V, Memory(), Br=Br, Bc=1024)[-1].traffic
    standard = standard_io(Q, K, V, Memory())[-1].traffic
    assert (standard, fa2) == (69_206_016, 34_607_104)
    assert round(standard / fa2, 1) == 2.0


@given(d=st.integers(16, 256), r=st.one_of(st.floats(0.25, 0.8), st.floats(1.25, 4.0)))
def test_flash_beats_standard_traffic_only_when_M_above_3d2(d, r):
    """FA-1 moves ~12 N^2 d^2 / M elements against the standard 4N^2: better iff M > 3d^2
    (asymptotically in N; the 4N statistics term moves the edge by a factor 1 + 4/(3d), hence the margin)."""
    M, N = round(r * 3 * d * d), 1 << 20
    flash_better = fa1_traffic(N, N, d, fa1_paper_blocks(M, d)[1]) < standard_traffic(N, N, d)
    assert flash_better == (M > 3 * d * d), f"M = {M} = {r:.2f} x 3d^2: flash better = {flash_better}"


@given(d=st.integers(1, 256), Br=st.integers(1, 256))
def test_fa2_savings_tend_to_2Br_over_d(d, Br):
    limit = 2 * Br / d
    gaps = [abs(savings(N, d, Br=Br) / limit - 1) for N in (Br << 10, Br << 20, Br << 30)]
    assert gaps[2] < gaps[1] < gaps[0] or gaps[2] == 0, f"savings do not converge to 2Br/d: gaps {gaps}"
    assert gaps[2] < 1e-6


@given(log_d=st.integers(4, 10), Bc=st.integers(8, 1024))
def test_fa1_savings_tend_to_M_over_3d2(log_d, Bc):
    """With M = 4d Bc (so the paper's Bc is exact) savings -> 4Bc/(3d + 4) = M/(3d^2) / (1 + 4/(3d))."""
    d = 1 << log_d
    M = 4 * d * Bc
    at_large_N = savings(1 << 40, d, M=M)
    assert math.isclose(at_large_N, 4 * Bc / (3 * d + 4), rel_tol=1e-6)
    assert abs(at_large_N / (M / (3 * d * d)) - 1) <= 4 / (3 * d), "savings are not M/(3d^2) to within 4/(3d)"


def test_memory_counts_what_moves():
    """The counter itself: a load and a store of a (3, 4) block are 12 elements each way."""
    mem, hbm = Memory(capacity=12), torch.zeros(3, 4, dtype=torch.float64)
    block = mem.load(hbm)
    mem.store(hbm, block + 1)
    assert (mem.reads, mem.writes, mem.peak) == (12, 12, 12) and bool((hbm == 1).all())
    try:
        mem.hold(torch.zeros(1))
    except SramOverflow:
        return
    raise AssertionError("Memory accepted a 13th element into an SRAM of 12")
