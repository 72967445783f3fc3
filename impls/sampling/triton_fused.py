"""Logits processing fused into one Triton kernel, one program per row, without a sort: penalties, temperature,
then top-k, top-p and min-p (transformers' order) by pairwise comparison of the row's values in tiles, softmax.

Pass 1 finds the row's maximum m and its first index (a greedy row's one-hot token).  Pass 2 counts, for each
token j, the tokens ranked strictly above it (ties keep their rank: ties="keep") and sums their mass: j is in the
top-k set when fewer than k are above it, and since that set is an upper set, the mass above a member is the mass
of top-k tokens above it -- what top-p compares with top_p times the set's mass.  Pass 3 applies top-p and min-p
(exp(x_j - m) >= min_p is p_j >= min_p max p) and pass 4 normalizes.  The pairwise pass costs O(V^2 / BLOCK^2)
tiles per row: exact and sort-free at the vocabularies it declares, a demonstration of the contract rather than
FlashInfer's O(V) kernels.  Invariant: every decision compares values of one row only, so a row's output is the
same in any batch (batch_invariant).

Optional: Triton is imported on first call.  Natively the kernel runs on CUDA ("triton_fused"); with
TRITON_INTERPRET=1 Triton's interpreter runs it on CPU tensors ("triton_fused_interpret", registered only then).
"""

import functools
import importlib.util
import os

import torch

from llm_inference_harness.contracts.sampling import check_inputs
from llm_inference_harness.engine.registry import register

BLOCK = 64
# Natively a program serves one row.  The interpreter runs each program's every op in Python, a fixed cost per op
# whatever its size, so there a program serves 16 rows at once: the same arithmetic per row, 16 times fewer ops.
ROWS_INTERPRETED = 16


@functools.cache
def _kernel():
    global tl, penalized  # a kernel finds the functions it calls among its module's globals
    import triton
    import triton.language as tl

    @triton.jit
    def penalized(L, SEEN, COUNTS, rows, ids, B, V, r, f, a, T):
        """(ROWS, BLOCK): the rows' values at ``ids``, penalized, then divided by T (1 for a greedy row)."""
        valid = (rows[:, None] < B) & (ids[None, :] < V)
        at = rows[:, None] * V + ids[None, :]
        x = tl.load(L + at, mask=valid, other=float("-inf"))
        seen = tl.load(SEEN + at, mask=valid, other=0) != 0
        c = tl.load(COUNTS + at, mask=valid, other=0.0)
        x = tl.where(seen, tl.where(x > 0, x / r[:, None], x * r[:, None]), x)
        x = x - f[:, None] * c - a[:, None] * tl.where(c > 0, 1.0, 0.0)
        return x / T[:, None]

    @triton.jit(do_not_specialize=["B", "V"])
    def process_kernel(L, SEEN, COUNTS, TEMP, TOPK, TOPP, MINP, REP, PRES, FREQ, BEFORE, OUT, B, V,
                       ROWS: tl.constexpr, BLOCK: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
        live = rows < B
        T = tl.load(TEMP + rows, mask=live, other=1.0)
        k, top_p = tl.load(TOPK + rows, mask=live, other=0), tl.load(TOPP + rows, mask=live, other=1.0)
        min_p = tl.load(MINP + rows, mask=live, other=0.0)
        r, a = tl.load(REP + rows, mask=live, other=1.0), tl.load(PRES + rows, mask=live, other=0.0)
        f = tl.load(FREQ + rows, mask=live, other=0.0)
        greedy = T == 0
        T = tl.where(greedy, 1.0, T)
        k = tl.where(k > 0, k, V)  # top_k 0 is off
        cut = tl.where(top_p < 1, top_p, 2.0)  # top_p 1 is off: no mass before a token reaches 2
        lanes = tl.arange(0, BLOCK)
        m = tl.full([ROWS], float("-inf"), tl.float32)
        first = tl.full([ROWS], 0, tl.int32) + V
        for j0 in range(0, V, BLOCK):  # pass 1: each row's maximum m and its first index
            ids = j0 + lanes
            x = penalized(L, SEEN, COUNTS, rows, ids, B, V, r, f, a, T)  # (ROWS, BLOCK)
            block_max = tl.max(x, 1)
            block_first = tl.min(tl.where(x == block_max[:, None], ids[None, :], V), 1)
            first = tl.where(block_max > m, block_first, first)
            m = tl.maximum(m, block_max)
        m = tl.where(live, m, 0.0)  # a padding row's values are all -inf: no NaN from -inf - -inf
        k_mass = tl.zeros([ROWS], tl.float32)
        for j0 in range(0, V, BLOCK):  # pass 2: per token, the count and mass of the tokens above it
            ids_j = j0 + lanes
            xj = penalized(L, SEEN, COUNTS, rows, ids_j, B, V, r, f, a, T)  # (ROWS, BLOCK)
            above = tl.zeros([ROWS, BLOCK], tl.int32)
            before = tl.zeros([ROWS, BLOCK], tl.float32)
            for i0 in range(0, V, BLOCK):
                xi = penalized(L, SEEN, COUNTS, rows, i0 + lanes, B, V, r, f, a, T)  # (ROWS, BLOCK)
                higher = xi[:, :, None] > xj[:, None, :]  # (ROWS, BLOCK_i, BLOCK_j)
                above += tl.sum(tl.where(higher, 1, 0), 1)
                before += tl.sum(tl.where(higher, tl.exp(xi - m[:, None])[:, :, None], 0.0), 1)
            in_k = (above < k[:, None]) & (xj > float("-inf"))
            # the top-k set is an upper set: the tokens above one of its tokens are its own, so `before` is the mass
            # of the top-k tokens above j -- the top-p rule's mass, unnormalized; +inf marks a token outside it
            at = rows[:, None] * V + ids_j[None, :]
            tl.store(BEFORE + at, tl.where(in_k, before, float("inf")), mask=live[:, None] & (ids_j[None, :] < V))
            k_mass += tl.sum(tl.where(in_k, tl.exp(xj - m[:, None]), 0.0), 1)
        tl.debug_barrier()  # every lane reads what the others wrote
        kept_mass = tl.zeros([ROWS], tl.float32)
        for j0 in range(0, V, BLOCK):  # pass 3: top-p over the top-k set, min-p (p_j / max p = exp(x_j - m))
            ids = j0 + lanes
            valid = live[:, None] & (ids[None, :] < V)
            at = rows[:, None] * V + ids[None, :]
            x = penalized(L, SEEN, COUNTS, rows, ids, B, V, r, f, a, T)
            e = tl.exp(x - m[:, None])
            before = tl.load(BEFORE + at, mask=valid, other=float("inf"))
            e = tl.where((before < (cut * k_mass)[:, None]) & (e >= min_p[:, None]), e, 0.0)
            tl.store(OUT + at, e, mask=valid)
            kept_mass += tl.sum(e, 1)
        tl.debug_barrier()
        kept_mass = tl.where(kept_mass > 0, kept_mass, 1.0)  # a padding row keeps nothing
        for j0 in range(0, V, BLOCK):  # pass 4: normalize; a greedy row is one-hot at its first maximum
            ids = j0 + lanes
            valid = live[:, None] & (ids[None, :] < V)
            at = rows[:, None] * V + ids[None, :]
            e = tl.load(OUT + at, mask=valid, other=0.0)
            one_hot = tl.where(ids[None, :] == first[:, None], 1.0, 0.0)
            tl.store(OUT + at, tl.where(greedy[:, None], one_hot, e / kept_mass[:, None]), mask=valid)

    return process_kernel


def triton_fused(logits, params):
    check_inputs(logits, params)
    B, V = logits.shape
    out = torch.empty(B, V, dtype=torch.float32, device=logits.device)  # (B, V)
    if not B:
        return out
    dev = logits.device

    def rows(name, dtype=torch.float32):
        return torch.tensor(getattr(params, name), dtype=dtype, device=dev)  # (B,)

    seen = torch.zeros(B, V, dtype=torch.int8)
    counts = torch.zeros(B, V, dtype=torch.float32)
    for b in range(B):
        seen[b, list(params.prompt_tokens[b]) + list(params.output_tokens[b])] = 1
        for t in params.output_tokens[b]:
            counts[b, t] += 1
    scratch = torch.empty(B, V, dtype=torch.float32, device=dev)  # per token, the top-k mass above it
    per_program = ROWS_INTERPRETED if os.environ.get("TRITON_INTERPRET") == "1" else 1
    _kernel()[(-(-B // per_program),)](
        logits.float().contiguous(), seen.to(dev), counts.to(dev), rows("temperature"), rows("top_k", torch.int32),
        rows("top_p"), rows("min_p"), rows("repetition_penalty"), rows("presence_penalty"), rows("frequency_penalty"),
        scratch, out, B, V, ROWS=per_program, BLOCK=BLOCK)
    return out


if importlib.util.find_spec("triton") is not None:  # the "triton" extra; without it nothing registers
    _CITE = "a fused, sort-free Triton kernel for the contract (pairwise ranks; FlashInfer's contract, not its O(V))"
    _CAPS = {"returns": "probs", "order": "transformers", "ties": "keep"}
    register("sampling", "triton_fused", devices=("cuda",), dtypes=("float32",), cite=_CITE,
             caps={**_CAPS, "max_vocab": 4096, "call_limit_s": 120, "batch_invariant": True,
                   "deterministic": True})(triton_fused)
    if os.environ.get("TRITON_INTERPRET") == "1":  # Triton's interpreter runs the same kernel on CPU tensors
        # Its bits are NumPy's, not the GPU's: batch invariance and determinism are claims of the native kernel.
        register("sampling", "triton_fused_interpret", devices=("cpu",), dtypes=("float32",), cite=_CITE,
                 caps={**_CAPS, "max_vocab": 64})(triton_fused)
