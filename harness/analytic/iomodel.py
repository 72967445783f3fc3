"""An accounting model of GPU memory: an HBM of unbounded size and an SRAM of M elements.

Attention kernels run here as *instrumented twins*: small float64 loops over one head's (N, d)
matrices that move every block through a `Memory`, which counts each element read from HBM into
SRAM and written back, and the peak number of elements resident in SRAM (an allocation past the
capacity M raises `SramOverflow`).  The twins compute real attention, so a test can check both
the answer and the traffic; the closed forms below are the paper's counts, which the twins must
reproduce exactly.

    standard (Algorithm 0 of FlashAttention):  S, P written to and read back from HBM
    FA-1 (Dao et al. 2022, Algorithm 1):       K/V blocks outer; O, l, m re-read and re-written
    FA-2 (Dao 2023, Algorithm 1):              Q blocks outer; O and L = m + log l written once

Sizes are in elements (multiply by the dtype's bytes for bytes).  On the ``meta`` device a twin
counts the traffic of a full-size problem without computing anything.  Dao et al. 2022, Sec. 3.2 and
Theorem 2, count HBM accesses the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


class SramOverflow(RuntimeError):
    """A twin asked for more SRAM than the capacity M."""


@dataclass
class IOStats:
    reads: int  # elements moved HBM -> SRAM
    writes: int  # elements moved SRAM -> HBM
    peak_sram: int  # most elements resident in SRAM at once
    blocks: int = 0  # (query block, key block) pairs visited

    @property
    def traffic(self) -> int:
        return self.reads + self.writes


class Memory:
    """Counts HBM traffic and SRAM residency; `capacity=None` is an unbounded SRAM."""

    def __init__(self, capacity: int | None = None):
        self.capacity, self.reads, self.writes, self.resident, self.peak = capacity, 0, 0, 0, 0

    def load(self, hbm: torch.Tensor) -> torch.Tensor:
        """Read a block from HBM into SRAM."""
        self.reads += hbm.numel()
        return self.hold(hbm.clone())

    def store(self, hbm: torch.Tensor, sram: torch.Tensor) -> None:
        """Write an SRAM block back into the HBM block ``hbm`` (a view of an HBM tensor)."""
        self.writes += sram.numel()
        hbm.copy_(sram)

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        """Mark a tensor computed on chip as resident in SRAM."""
        self.resident += t.numel()
        self.peak = max(self.peak, self.resident)
        if self.capacity is not None and self.resident > self.capacity:
            raise SramOverflow(f"SRAM holds {self.resident} elements, more than its capacity M = {self.capacity}")
        return t

    def free(self, *ts: torch.Tensor) -> None:
        self.resident -= sum(t.numel() for t in ts)

    def stats(self, blocks: int = 0) -> IOStats:
        return IOStats(self.reads, self.writes, self.peak, blocks)


def _finite(m: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(m), m, 0)


def _mask(S: torch.Tensor, i0: int, j0: int, Nq: int, Nk: int) -> torch.Tensor:
    """Bottom-right causal mask of the block whose top-left element is (i0, j0), in place."""
    i = torch.arange(i0, i0 + S.shape[0], device=S.device)[:, None]  # (Br, 1)
    j = torch.arange(j0, j0 + S.shape[1], device=S.device)[None, :]  # (1, Bc)
    return S.masked_fill_(j > i + Nk - Nq, float("-inf"))


# ---------------------------------------------------------------------------------------------
# the twins
def standard_io(Q, K, V, mem: Memory, *, causal: bool = False):
    """Algorithm 0: S = QK^T written to HBM, P = softmax(S) written to HBM, O = PV.

    Each operand is charged once (the algorithm's own accounting), which needs the whole operand
    on chip: run it with an unbounded Memory.  Returns (O, IOStats)."""
    (Nq, d), Nk = Q.shape, K.shape[0]
    S_hbm, P_hbm, O = Q.new_empty(Nq, Nk), Q.new_empty(Nq, Nk), torch.empty_like(Q)  # noqa: E741 - paper notation
    q, k = mem.load(Q), mem.load(K)
    S = mem.hold(q @ k.T / math.sqrt(d))  # (Nq, Nk)
    if causal:
        _mask(S, 0, 0, Nq, Nk)
    mem.store(S_hbm, S)
    mem.free(q, k, S)
    S = mem.load(S_hbm)
    P = torch.softmax(S, dim=-1).nan_to_num_(0.0)  # rows that see no key give 0
    mem.store(P_hbm, P)
    mem.free(S)
    P, v = mem.load(P_hbm), mem.load(V)
    mem.store(O, mem.hold(P @ v))
    return O, mem.stats()


def fa2_io(Q, K, V, mem: Memory, *, Br: int, Bc: int, causal: bool = False):
    """FA-2 loop order: for each query block, stream all key blocks past a resident (acc, l, m);
    write O_i and L_i = m + log l once.  Causal key blocks above the diagonal are skipped.
    Returns (O, L, IOStats)."""
    (Nq, d), Nk = Q.shape, K.shape[0]
    O, L, blocks = torch.empty_like(Q), Q.new_empty(Nq), 0  # noqa: E741 - paper notation
    for i0 in range(0, Nq, Br):
        i1 = min(i0 + Br, Nq)
        Qi = mem.load(Q[i0:i1]) / math.sqrt(d)  # (Br, d)
        acc = mem.hold(Q.new_zeros(i1 - i0, d))  # (Br, d)
        m = mem.hold(Q.new_full((i1 - i0,), float("-inf")))  # (Br,)
        l = mem.hold(Q.new_zeros(i1 - i0))  # noqa: E741 - (Br,)
        for j0 in range(0, Nk, Bc):
            if causal and j0 > i1 - 1 + Nk - Nq:  # this and every later block is above the diagonal
                break
            j1, blocks = min(j0 + Bc, Nk), blocks + 1
            Kj, Vj = mem.load(K[j0:j1]), mem.load(V[j0:j1])  # (Bc, d) each
            S = mem.hold(Qi @ Kj.T)  # (Br, Bc)
            if causal:
                _mask(S, i0, j0, Nq, Nk)
            m_new = mem.hold(torch.maximum(m, S.amax(dim=-1)))  # (Br,)
            S.sub_(_finite(m_new)[:, None]).exp_()  # P~ overwrites S on chip
            alpha = torch.exp(m - _finite(m_new))
            l.mul_(alpha).add_(S.sum(dim=-1))
            acc.mul_(alpha[:, None]).add_(S @ Vj)
            m.copy_(m_new)
            mem.free(Kj, Vj, S, m_new)
        mem.store(O[i0:i1], torch.where(l[:, None] > 0, acc / torch.where(l > 0, l, 1)[:, None], 0))
        mem.store(L[i0:i1], m + torch.log(l))  # logsumexp of each row, kept for the backward pass
        mem.free(Qi, acc, m, l)
    return O, L, mem.stats(blocks)


def fa1_io(Q, K, V, mem: Memory, *, Br: int, Bc: int):
    """FA-1, Algorithm 1 line by line: O, l, m initialized in HBM; for each key block j (outer)
    and query block i (inner) read Q_i, O_i, l_i, m_i, fold the block in, write O_i, l_i, m_i.
    Returns (O, IOStats)."""
    (N, d), Nk = Q.shape, K.shape[0]
    O, l, m = torch.empty_like(Q), Q.new_empty(N), Q.new_empty(N)  # noqa: E741
    for hbm, init in ((O, 0.0), (l, 0.0), (m, float("-inf"))):  # line 2: initialize in HBM
        mem.store(hbm, torch.full_like(hbm, init))
    blocks = 0
    for j0 in range(0, Nk, Bc):
        Kj, Vj = mem.load(K[j0 : j0 + Bc]), mem.load(V[j0 : j0 + Bc])  # line 6
        for i0 in range(0, N, Br):
            i1, blocks = min(i0 + Br, N), blocks + 1
            Qi, Oi, li, mi = (mem.load(t[i0:i1]) for t in (Q, O, l, m))  # line 8
            S = mem.hold(Qi @ Kj.T / math.sqrt(d))  # line 9: (Br, Bc)
            m_t = mem.hold(S.amax(dim=-1))  # line 10: m~_ij
            S.sub_(m_t[:, None]).exp_()  # P~_ij overwrites S
            l_t = mem.hold(S.sum(dim=-1))  # l~_ij
            m_new = mem.hold(torch.maximum(mi, m_t))  # line 11
            l_new = mem.hold(torch.exp(mi - m_new) * li + torch.exp(m_t - m_new) * l_t)
            S.mul_(torch.exp(m_t - m_new)[:, None])  # line 12, in place on chip
            Oi.mul_((li * torch.exp(mi - m_new))[:, None]).addmm_(S, Vj).div_(l_new[:, None])
            for hbm, sram in ((O, Oi), (l, l_new), (m, m_new)):  # lines 12-13
                mem.store(hbm[i0:i1], sram)
            mem.free(Qi, Oi, li, mi, S, m_t, l_t, m_new, l_new)
        mem.free(Kj, Vj)
    return O, mem.stats(blocks)


# ---------------------------------------------------------------------------------------------
# closed forms (elements); the twins must reproduce them exactly
def standard_traffic(Nq: int, Nk: int, d: int) -> int:
    """Read Q, K, S, P, V; write S, P, O: 4N^2 + 4Nd when Nq = Nk = N."""
    return (Nq * d + 2 * Nk * d + 2 * Nq * Nk) + (2 * Nq * Nk + Nq * d)


def fa2_traffic(Nq: int, Nk: int, d: int, Br: int) -> int:
    """Q once, K and V once per query block, O and L written once: Nd + 2Nd(N/Br) + Nd + N."""
    return Nq * d + 2 * Nk * d * math.ceil(Nq / Br) + Nq * d + Nq


def fa1_traffic(N: int, Nk: int, d: int, Bc: int) -> int:
    """Initialize O, l, m; K, V once; per key block read Q, O, l, m and write O, l, m."""
    Tc = math.ceil(Nk / Bc)
    return (N * d + 2 * N) + 2 * Nk * d + Tc * (2 * N * d + 2 * N) + Tc * (N * d + 2 * N)


def causal_blocks(N: int, B: int) -> int:
    """Blocks an FA-2 causal kernel with Br = Bc = B visits: T(T+1)/2 for T = N/B."""
    T = math.ceil(N / B)
    return T * (T + 1) // 2


def fa2_sram(Br: int, Bc: int, d: int) -> int:
    """Resident in fa2_io: Q_i, acc (Br d each), K_j, V_j (Bc d each), S (Br Bc), m, l, m_new."""
    return 2 * Br * d + 2 * Bc * d + Br * Bc + 3 * Br


def fa1_sram(Br: int, Bc: int, d: int) -> int:
    """Resident in fa1_io: K_j, V_j, Q_i, O_i, S, and six row statistics."""
    return 2 * Bc * d + 2 * Br * d + Br * Bc + 6 * Br


def fa1_paper_blocks(M: int, d: int) -> tuple[int, int]:
    """Algorithm 1, line 1: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d).  These sizes ignore the
    S block and the rounding, so they can overshoot M, by at most M/4 + 11d (see fa1_sram)."""
    Bc = math.ceil(M / (4 * d))
    return min(Bc, d), Bc


def fitting_blocks(M: int, d: int, loop: str) -> tuple[int, int]:
    """The largest blocks whose footprint fits in M: FA-1 keeps Br = min(Bc, d); FA-2 uses Br = Bc."""
    footprint = {"fa1": lambda b: fa1_sram(min(b, d), b, d), "fa2": lambda b: fa2_sram(b, b, d)}[loop]
    if footprint(1) > M:
        raise ValueError(f"fitting_blocks: M = {M} cannot hold even 1-row blocks of head dim d = {d}")
    lo, hi = 1, M  # footprint is increasing in b: binary search for the largest b that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if footprint(mid) <= M else (lo, mid - 1)
    return (min(lo, d), lo) if loop == "fa1" else (lo, lo)


def savings(N: int, d: int, *, Br: int | None = None, M: int | None = None) -> float:
    """Standard traffic / flash traffic: FA-2 with query block Br, or FA-1 with the paper's blocks for M."""
    flash = fa2_traffic(N, N, d, Br) if Br is not None else fa1_traffic(N, N, d, fa1_paper_blocks(M, d)[1])
    return standard_traffic(N, N, d) / flash
