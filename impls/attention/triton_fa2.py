"""FlashAttention-2 forward as a Triton kernel: one program per (query block, batch x head), K/V blocks streamed.

Each program keeps its query block and the running (m, l, acc) on chip while key blocks stream by, and
writes o = acc / l once, with L = m + log l for the backward.  Invariant after key block j: acc / l is
the exact softmax average over keys 0..j.  Tails (Nq, Nk not multiples of the block, d not a power of
two) are masked loads; causal programs stop at the last key their bottom row sees.  GQA: query head h
reads kv head h // G.  Dao 2023, "FlashAttention-2", Sec. 3.1 and 3.3, Algorithm 1.

Optional: Triton is imported on first call, never by the harness.  Natively the kernel runs on CUDA
("triton_fa2"); with TRITON_INTERPRET=1 Triton's interpreter runs it on CPU tensors
("triton_fa2_interpret", registered only then).
"""

import functools
import importlib.util
import os

import torch

from llm_inference_harness.contracts.attention import check_inputs
from llm_inference_harness.engine.registry import register


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["H", "G", "Nq", "Nk"])  # one compile per dtype, d and causal
    def fa2_forward_kernel(Q, K, V, O, LSE, H, G, Nq, Nk, d, scale,  # noqa: E741 - paper notation
                           CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        block, bh = tl.program_id(0), tl.program_id(1)  # query block, batch * H + head
        kv = (bh // H) * (H // G) + (bh % H) // G  # batch * Hkv + kv head: query head h reads kv head h // G
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        dims = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
        q = tl.load(Q + bh * Nq * d + rows[:, None] * d + dims[None, :],
                    mask=(rows[:, None] < Nq) & (dims[None, :] < d), other=0.0)  # (BLOCK_M, BLOCK_D)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)  # noqa: E741
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_end = tl.minimum(Nk, (block + 1) * BLOCK_M + Nk - Nq) if CAUSAL else Nk  # keys past the diagonal
        for j0 in range(0, k_end, BLOCK_N):
            cols = j0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
            kv_mask = (cols[:, None] < Nk) & (dims[None, :] < d)  # (BLOCK_N, BLOCK_D)
            k = tl.load(K + kv * Nk * d + cols[:, None] * d + dims[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N) in fp32
            seen = cols[None, :] < Nk  # keys past Nk are padding
            if CAUSAL:
                seen = seen & (cols[None, :] <= rows[:, None] + Nk - Nq)  # bottom-right aligned
            s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key shifts by 0
            p = tl.exp(s - m_safe[:, None])  # (BLOCK_M, BLOCK_N)
            alpha = tl.exp(m - m_safe)
            l = alpha * l + tl.sum(p, 1)  # noqa: E741
            v = tl.load(V + kv * Nk * d + cols[:, None] * d + dims[None, :], mask=kv_mask, other=0.0)
            acc = alpha[:, None] * acc + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m = m_new
        o = acc / tl.where(l == 0, 1.0, l)[:, None]  # rows that saw no key: acc = 0, o = 0 (NaN stays NaN)
        tl.store(O + bh * Nq * d + rows[:, None] * d + dims[None, :], o.to(O.dtype.element_ty),
                 mask=(rows[:, None] < Nq) & (dims[None, :] < d))
        lse = tl.where(l == 0, float("-inf"), m + tl.log(tl.where(l == 0, 1.0, l)))  # no key seen: L = -inf
        tl.store(LSE + bh * Nq + rows, lse, mask=rows < Nq)

    return triton, fa2_forward_kernel


def triton_fa2_forward(q, k, v, *, causal=False, scale=None, block_m=64, block_n=64):
    """Returns (o, L): o (B, H, Nq, d) in q's dtype, L (B, H, Nq) in float32."""
    scale = check_inputs(q, k, v, scale, causal)
    triton, kernel = _kernel()
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)  # (B, H, Nq, d)
    lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device)  # (B, H, Nq)
    if q.numel():
        grid = (triton.cdiv(Nq, block_m), B * H)
        kernel[grid](q, k, v, o, lse, H, H // Hkv, Nq, Nk, d, scale, CAUSAL=causal, BLOCK_M=block_m,
                     BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)))  # tl.dot needs >= 16
    return o, lse


def _registered(block_m: int, block_n: int):
    def attention(q, k, v, *, causal=False, scale=None, return_lse=False):
        o, lse = triton_fa2_forward(q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n)
        return (o, lse) if return_lse else o

    return attention


if importlib.util.find_spec("triton") is not None:  # the "triton" extra; without it nothing registers
    _CITE = "Dao 2023, FlashAttention-2, Algorithm 1 (Triton)"
    _CAPS = {"Br": 64, "Bc": 64, "tiled": True, "returns_lse": True, "triton": True}
    # Natively the first call of each (dtype, d, causal) compiles: seconds, more while every test worker compiles.
    register("attention", "triton_fa2", devices=("cuda",), dtypes=("float32", "float16", "bfloat16"), cite=_CITE,
             caps={**_CAPS, "call_limit_s": 120})(_registered(64, 64))
    if os.environ.get("TRITON_INTERPRET") == "1":  # Triton's interpreter runs the same kernel on CPU tensors
        # The native block sizes: what passes here is the configuration CUDA runs (and bigger blocks mean
        # fewer programs and loop trips, which is what the interpreter's time goes into).
        register("attention", "triton_fa2_interpret", devices=("cpu",), dtypes=("float32",), cite=_CITE,
                 caps={**_CAPS, "max_len": 80})(_registered(64, 64))
