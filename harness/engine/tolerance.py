"""The one tolerance table, and the earned-tolerance check that uses it.

An exact technique's output in dtype T is compared with the float64 truth computed from the
same (already rounded) inputs.  The allowed error is *earned*, as in FlashAttention's tests:

    max|out - truth|  <=  k * max|plain - truth|  +  floor * max(1, max|truth|)

where ``plain`` is the straightforward computation carried out in T itself -- in a few
mathematically identical operation orders, taking the largest error, because one order's error is
a single random draw (its ratio to a kernel's error exceeded 2 in ~10% of large-logit cases) while
the maximum over four is a stable measure of what rounding in T costs.  The bound follows
dtype, size and input scale by itself; a wrong mask or a missing rescale misses it by orders of
magnitude.  ``k`` comes from FlashAttention (2 forward, 3 gradients).  ``floor`` keeps a plain
computation that happens to be exact from demanding bit-exactness of a differently ordered one,
and it depends on what dominates the plain error:
  * bfloat16 / float16: rounding P and the output to T, the same few ulps for every kernel, so
    k * plain is stable and the floor is FlashAttention's own -- 2 ulps (4 for gradients).  It must
    stay that small: one ulp of 1 is 2^-7 in bfloat16, and the 16-ulp floor this table once had
    (0.125) let an output 10% too small pass every property.
  * float32 / float64: rounding inside the d-long dot products, a fresh draw for every summation
    order; a blocked-GEMM kernel's draw was seen at 3.8x the largest of the four plain orders
    (Triton's interpreter, d = 128, scale 1: 4.3e-6 against 1.1e-6).  16 ulps (64 for gradients),
    2e-6 of max(1, |truth|) in float32, absorbs such draws and is far below any real bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tol:
    k: float  # multiple of the plain computation's error that an implementation may spend
    floor: float  # absolute floor, relative to max(1, max|truth|)


EPS = {dt: torch.finfo(dt).eps for dt in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}
LOW_PRECISION = (torch.bfloat16, torch.float16)
# floor, in ulps of T, of an exact kernel's forward output (the module docstring says why they differ)
FLOOR_ULPS = {dt: 2 if dt in LOW_PRECISION else 16 for dt in EPS}

# (kind, dtype) -> Tol.  "forward": outputs of exact kernels; "grad": gradients (longer chains).
TOLERANCES: dict[tuple[str, torch.dtype], Tol] = {
    **{("forward", dt): Tol(k=2.0, floor=FLOOR_ULPS[dt] * eps) for dt, eps in EPS.items()},
    **{("grad", dt): Tol(k=3.0, floor=(2 if dt in LOW_PRECISION else 4) * FLOOR_ULPS[dt] * eps)
       for dt, eps in EPS.items()},
    # Logits of 1e3-1e4 (or far below zero): each score, and each logsumexp c a kernel subtracts instead of
    # dividing by the row sum, carries a rounding error of up to |s| * eps (|c| * eps) that exp() turns into
    # an output error of that size, a fresh random draw for every operation order (kernel/plain ratios above
    # 4 were found by Hypothesis).  Such comparisons add the conditioning bound of
    # references.attention_score_conditioning (forward error analysis) to FlashAttention's k = 2; their plain
    # computations carry half-precision scores in float32, as the kernels must (contracts/attention.py).
    **{("large_logits", dt): Tol(k=2.0, floor=FLOOR_ULPS[dt] * eps) for dt, eps in EPS.items()},
    # quantization (harness/contracts/quantization.py).  "quantize": |w - dq(q(w))| <= k * s + floor *
    # (|w| + |dq|): k = 1/2 is the exact-arithmetic bound of rounding to a grid of step s; the floor
    # pays for computing w / s and q * s in T (one rounding each, relative to the values involved).
    **{("quantize", dt): Tol(k=0.5, floor=4 * eps) for dt, eps in EPS.items()},
    # "quantized_matmul": |y - x @ w.T| <= k * (the scheme's exact-arithmetic bound, derived from its
    # scales) + floor * sum_k |x||w|: the floor covers the matmul's own rounding in T (n eps worst case
    # for n <= 256 terms, typically sqrt(n) eps).  bfloat16 / float16 matmuls accumulate in float32, so
    # there it is the rounding of the dequantized weights and of y to T: a few eps, not 64 (= 0.5).
    **{("quantized_matmul", dt): Tol(k=1.0, floor=(4 if dt in LOW_PRECISION else 64) * eps)
       for dt, eps in EPS.items()},
    # kvcache (harness/contracts/kvcache.py).  "kv_int8": logits of an int8 KV cache vs the exact
    # float64 forward.  The plain error is that of the float64 forward whose keys/values went through
    # the same per-vector absmax int8 round trip (references.gpt_logits64(kv_bits=8)): what int8
    # storage alone costs.  k = 2 leaves room for the cache's own arithmetic in T moving a rare code by
    # one step; a wrong scale, clipping or a dropped sign costs orders of magnitude more.
    **{("kv_int8", dt): Tol(k=2.0, floor=FLOOR_ULPS[dt] * eps) for dt, eps in EPS.items()},
    # "kv_fp8": logits of a model whose cache stores keys and values as float8_e4m3fn, vs its exact float64
    # forward.  The plain error is that of the float64 forwards whose attention read every key and value rounded
    # to e4m3 at one scale per tensor, the largest over four scales a quarter octave apart (each moves the grid:
    # one rounding is one random draw) -- what 3 mantissa bits cost (references.kvcache.KV_FORMATS).  k = 2 as
    # for int8; a scale that saturates later tokens, or a dropped scale, costs more.
    **{("kv_fp8", dt): Tol(k=2.0, floor=FLOOR_ULPS[dt] * eps) for dt, eps in EPS.items()},
}
# Relations that hold exactly in real arithmetic, checked in float64 (merge laws, transforms).
FLOAT64_IDENTITY = 1e-12
# A float32 metric recorded at training time (harness/models/weights/*.json) and recomputed by the same
# code elsewhere: only the float32 reduction order may differ (thread count, BLAS build), a relative
# change of ~1e-7 per token averaged over ~13k tokens; a changed model, corpus or tokenizer moves the
# test NLL by >= 1e-3.
RECORDED_METRIC_RTOL = 1e-5
# speculative decoding: how far a probability vector handed to a sampler may sum from one.  A float64
# softmax of float32 logits is off by ~1e-16 per row; a table that forgot to normalize is off by >= 1e-3.
PROBABILITY_SUM = 1e-9


def dtype_of(name: str) -> torch.dtype:
    return {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
            "float16": torch.float16}[name]


def plain_error(truth: torch.Tensor, plains: list[torch.Tensor]) -> float:
    return max((p.double() - truth).abs().max().item() for p in plains) if truth.numel() else 0.0


def earned_bound(
    truth: torch.Tensor, plains: list[torch.Tensor], dtype: torch.dtype, kind: str = "forward",
    conditioning: float = 0.0,
) -> float:
    """The error an implementation in ``dtype`` may make against ``truth`` (float64).

    ``conditioning`` is an error that rounding the inputs of the computation already implies
    (derived by forward error analysis, never tuned), added for ill-conditioned cases.
    """
    tol = TOLERANCES[(kind, dtype)]
    plain_err = plain_error(truth, plains)
    scale = max(1.0, truth.abs().max().item()) if truth.numel() else 1.0
    return tol.k * plain_err + tol.floor * scale + conditioning


def assert_earned(
    out: torch.Tensor, truth: torch.Tensor, plains: list[torch.Tensor], dtype: torch.dtype, *, what: str,
    kind: str = "forward", conditioning: float = 0.0,
) -> None:
    """Assert ``out`` is as close to ``truth`` as the earned bound allows; the message says by how much."""
    bound = earned_bound(truth, plains, dtype, kind, conditioning)
    diff = (out.double() - truth).abs()
    err = diff.max().item() if diff.numel() else 0.0
    if not err <= bound:  # also catches NaN
        flat = int(diff.nan_to_num(float("inf")).argmax())
        where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
        plain_err = plain_error(truth, plains)
        got, want = out.reshape(-1)[flat].item(), truth.reshape(-1)[flat].item()
        digits = 6 if not (err < 1e-5 * abs(want)) else 17  # enough digits that the two values differ in print
        raise with_margin(AssertionError(
            f"{what}: max error {err:.3g} at {where} exceeds the earned bound {bound:.3g} "
            f"(= {TOLERANCES[(kind, dtype)].k:g} x plain {dtype} error {plain_err:.3g} + floor); "
            f"got {got:.{digits}g}, truth {want:.{digits}g}"
        ), err, bound)


def with_margin(exc: AssertionError, err: float, bound: float) -> AssertionError:
    """``exc`` carrying ``margin`` = err / bound, how far past its bound a failing case went (inf for a NaN
    error or a zero bound): the runner reports it as Verdict.margin."""
    exc.margin = err / bound if bound > 0 and err == err else float("inf")
    return exc
