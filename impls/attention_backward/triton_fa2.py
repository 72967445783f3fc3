"""FlashAttention-2 backward as two Triton kernels: dK, dV per key block, then dQ per query block.

Every P block is recomputed as exp(scale Q_i K_j^T - L_i) and dS_ij = P_ij o (dO_i V_j^T - D_i) with
D_i = dO_i . O_i; no (Nq, Nk) matrix exists.  The dK/dV program of key block j (one per kv head) walks
the G query heads that read it and all their query blocks, so dK_j, dV_j are complete, summed over
the group, when it stores them; the dQ program of query block i walks the key blocks and needs no
atomics (the split Triton's FlashAttention tutorial uses).  Causal programs skip blocks entirely above
the bottom-right diagonal.  Dao 2023, "FlashAttention-2", Sec. 3.2, Algorithm 2.

Optional like impls/attention/triton_fa2.py: Triton is imported on first call; "triton_fa2" runs on
CUDA, "triton_fa2_interpret" on CPU tensors under TRITON_INTERPRET=1 (registered only then).
"""

import functools
import importlib.util
import os

import torch

from llm_inference_harness.contracts.attention_backward import check_backward_inputs
from llm_inference_harness.engine.registry import register


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["H", "G", "Nq", "Nk"])  # one compile per dtype, d and causal
    def dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, H, G, Nq, Nk, d, scale,
                    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        block, bkv = tl.program_id(0), tl.program_id(1)  # key block, batch * Hkv + kv head
        cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        kv_mask = (cols[:, None] < Nk) & (dims[None, :] < d)
        k = tl.load(K + bkv * Nk * d + cols[:, None] * d + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + bkv * Nk * d + cols[:, None] * d + dims[None, :], mask=kv_mask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        i_start = tl.maximum(0, block * BLOCK_N - (Nk - Nq)) if CAUSAL else 0  # rows above see none of these keys
        i_start = (i_start // BLOCK_M) * BLOCK_M
        for g in range(0, G):
            bh = bkv * G + g  # batch * H + query head: heads bkv*G .. bkv*G + G-1 read this kv head
            for i0 in range(i_start, Nq, BLOCK_M):
                rows = i0 + tl.arange(0, BLOCK_M)
                q_mask = (rows[:, None] < Nq) & (dims[None, :] < d)
                q = tl.load(Q + bh * Nq * d + rows[:, None] * d + dims[None, :], mask=q_mask, other=0.0)
                do = tl.load(DO + bh * Nq * d + rows[:, None] * d + dims[None, :], mask=q_mask, other=0.0)
                lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=0.0)
                delta = tl.load(DELTA + bh * Nq + rows, mask=rows < Nq, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N) in fp32
                seen = (cols[None, :] < Nk) & (rows[:, None] < Nq)
                if CAUSAL:
                    seen = seen & (cols[None, :] <= rows[:, None] + Nk - Nq)  # bottom-right aligned
                p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)  # P_ij recomputed; no-key rows come with L = 0
                ds = p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])  # dS_ij
                dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision="ieee")
                dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision="ieee") * scale
        tl.store(DK + bkv * Nk * d + cols[:, None] * d + dims[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + bkv * Nk * d + cols[:, None] * d + dims[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)

    @triton.jit(do_not_specialize=["H", "G", "Nq", "Nk"])  # one compile per dtype, d and causal
    def dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, H, G, Nq, Nk, d, scale,
                  CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        block, bh = tl.program_id(0), tl.program_id(1)  # query block, batch * H + head
        bkv = bh // G  # batch * Hkv + kv head
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        q_mask = (rows[:, None] < Nq) & (dims[None, :] < d)
        q = tl.load(Q + bh * Nq * d + rows[:, None] * d + dims[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + bh * Nq * d + rows[:, None] * d + dims[None, :], mask=q_mask, other=0.0)
        lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=0.0)
        delta = tl.load(DELTA + bh * Nq + rows, mask=rows < Nq, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_end = tl.minimum(Nk, (block + 1) * BLOCK_M + Nk - Nq) if CAUSAL else Nk
        for j0 in range(0, k_end, BLOCK_N):
            cols = j0 + tl.arange(0, BLOCK_N)
            kv_mask = (cols[:, None] < Nk) & (dims[None, :] < d)
            k = tl.load(K + bkv * Nk * d + cols[:, None] * d + dims[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + bkv * Nk * d + cols[:, None] * d + dims[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N) in fp32
            seen = (cols[None, :] < Nk) & (rows[:, None] < Nq)
            if CAUSAL:
                seen = seen & (cols[None, :] <= rows[:, None] + Nk - Nq)  # bottom-right aligned
            p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)  # P_ij recomputed; no-key rows come with L = 0
            ds = p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])  # dS_ij
            dq += tl.dot(ds.to(k.dtype), k, input_precision="ieee") * scale
        tl.store(DQ + bh * Nq * d + rows[:, None] * d + dims[None, :], dq.to(DQ.dtype.element_ty), mask=q_mask)

    return triton, dkdv_kernel, dq_kernel


def triton_fa2_backward(q, k, v, o, lse, do, *, causal=False, scale=None, block_m=64, block_n=64):
    scale = check_backward_inputs(q, k, v, o, lse, do, scale, causal)
    triton, dkdv_kernel, dq_kernel = _kernels()
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    delta = (do.float() * o.float()).sum(-1).contiguous()  # (B, H, Nq): D_i = dO_i . O_i
    lse = torch.where(torch.isfinite(lse), lse, 0).float().contiguous()  # (B, H, Nq); no-key rows fully masked
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    meta = dict(CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)))
    dkdv_kernel[(triton.cdiv(Nk, block_n), B * Hkv)](q, k, v, do, lse, delta, dk, dv, H, H // Hkv, Nq, Nk, d,
                                                      scale, **meta)
    dq_kernel[(triton.cdiv(Nq, block_m), B * H)](q, k, v, do, lse, delta, dq, H, H // Hkv, Nq, Nk, d, scale, **meta)
    return dq, dk, dv


def _registered(block_m: int, block_n: int):
    return lambda q, k, v, o, lse, do, *, causal=False, scale=None: triton_fa2_backward(
        q, k, v, o, lse, do, causal=causal, scale=scale, block_m=block_m, block_n=block_n)


if importlib.util.find_spec("triton") is not None:  # the "triton" extra; without it nothing registers
    _CITE = "Dao 2023, FlashAttention-2, Algorithm 2 (Triton)"
    _CAPS = {"Br": 64, "Bc": 64, "tiled": True, "triton": True}
    # Natively the first call of each (dtype, d, causal) compiles two kernels: seconds, more under load.
    register("attention_backward", "triton_fa2", devices=("cuda",), dtypes=("float32", "float16", "bfloat16"),
             cite=_CITE, caps={**_CAPS, "call_limit_s": 120})(_registered(64, 64))
    if os.environ.get("TRITON_INTERPRET") == "1":
        register("attention_backward", "triton_fa2_interpret", devices=("cpu",), dtypes=("float32",), cite=_CITE,
                 caps={**_CAPS, "max_len": 80})(_registered(64, 64))
