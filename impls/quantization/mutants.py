"""Known-wrong quantizers, each modelled on a real bug: the reference's absmax code path with one bug
switched on, and the zero-point quantizer with a wrong range.
"""

import torch

from llm_inference_harness.contracts.quantization import Quantized, check_inputs, qmax, scale_shape
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.quantization.absmax import quantize_absmax
from llm_inference_harness.impls.quantization.zeropoint import zeropoint

QUANTIZER_BUGS = {
    "signed_max": ("scale from max(w) instead of max|w|: a group whose largest magnitude is negative "
                   "clamps it", ("absmax_round_trips",)),
    "truncation": ("codes truncated toward zero instead of rounded: errors up to a full step",
                   ("error_within_half_step",)),
    "clamp_2_pow_b_minus_1": ("scale max|w| / 2^(b-1) and clamp to +-2^(b-1): the absmax code is 2^(b-1), "
                              "outside the symmetric range (128 wraps to -128 in int8)", ("codes_in_range",)),
    "group_crosses_rows": ("groups cut from the column-major (transposed) weight, so a group spans rows",
                           ("granularity_bounds_nest",)),
}


def buggy_quantize(w, *, bits, granularity="channel", group_size=None, bug: str):
    g = check_inputs(w, bits, granularity, group_size)
    rows, cols = w.shape
    top = 2 ** (bits - 1) if bug == "clamp_2_pow_b_minus_1" else qmax(bits)
    source = w.t() if bug == "group_crosses_rows" and granularity == "group" else w  # (cols, rows) when buggy
    blocks = source.reshape(1, 1, -1) if granularity == "tensor" else source.reshape(-1, cols // g, g)  # (R, G, g)
    peak = blocks.amax(dim=-1) if bug == "signed_max" else blocks.abs().amax(dim=-1)  # (R, G)
    s = peak / top
    safe = torch.where(s != 0, s, torch.ones_like(s))[..., None]
    ratio = blocks / safe
    q = (torch.trunc(ratio) if bug == "truncation" else torch.round(ratio)).clamp(-top, top)  # (R, G, g)
    if bug == "group_crosses_rows" and granularity == "group":
        q = q.reshape(cols, rows).t()  # codes back in place, but the scales stay in the crossed layout
    return Quantized(q.reshape(rows, cols).to(torch.int8), s.reshape(1, 1) if granularity == "tensor"
                     else s.reshape(rows, cols // g).abs())


for _bug, (_what, _killers) in QUANTIZER_BUGS.items():
    register("quantization", f"mutant_{_bug}", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
             mutant=True, bug=_what, killed_by=_killers, caps={"symmetric": True})(
        lambda w, *, bits, granularity="channel", group_size=None, _bug=_bug: buggy_quantize(
            w, bits=bits, granularity=granularity, group_size=group_size, bug=_bug))


@register("quantization", "mutant_zero_point_tensor_range", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          mutant=True, bug="a per-tensor min/max observer behind a per-channel / per-group API: every group gets "
          "the whole tensor's scale and zero point, and rows of small weights lose their resolution",
          killed_by=("zero_point_scales_match_reference",), caps={"symmetric": False}, exact=False)
def mutant_zero_point_tensor_range(w, *, bits, granularity="channel", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    qt = zeropoint(w, bits=bits, granularity="tensor")  # codes on the tensor's grid
    shape = scale_shape(w, granularity, group_size)
    return Quantized(qt.codes, qt.scale.expand(shape).contiguous(), qt.zero.expand(shape).contiguous())


@register("quantization", "mutant_zero_point_range_overflows", devices=("cpu", "cuda"),
          dtypes=("float64", "float32"), mutant=True, bug="scale (max - min) / (2^b - 1): max - min overflows to inf "
          "when the weights span more than the dtype's largest value", killed_by=("extreme_magnitudes",),
          caps={"symmetric": False}, exact=False)
def mutant_zero_point_range_overflows(w, *, bits, granularity="channel", group_size=None):
    return zeropoint(w, bits=bits, granularity=granularity, group_size=group_size, range_first=True)


# --- shapes, formats and bad input: bugs the cases could not reach before square weights, rows past 256 and
# declared formats were drawn ----------------------------------------------------------------------------------
@register("quantization", "mutant_square_as_in_out", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          mutant=True, bug="a kernel that sniffs its layout from the shape: a square weight is taken as (in, out), "
          "so its per-channel and per-group scales run down the columns",
          killed_by=("granularity_bounds_nest", "extreme_magnitudes", "absmax_round_trips"), caps={"symmetric": True})
def mutant_square_as_in_out(w, *, bits, granularity="channel", group_size=None):
    square = isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[0] == w.shape[1]
    if not square or granularity == "tensor":
        return quantize_absmax(w, bits, granularity, group_size)
    qt = quantize_absmax(w.t(), bits, granularity, group_size)  # (in, out) read as (out, in)
    return Quantized(qt.codes.t().contiguous(), qt.scale)


@register("quantization", "mutant_empty_weight_crashes", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          mutant=True, bug="no check for an empty w (0 x 8): torch's amax raises a raw RuntimeError deep inside, "
          "not a ValueError naming w", killed_by=("rejects_bad_input",), caps={"symmetric": True})
def mutant_empty_weight_crashes(w, *, bits, granularity="channel", group_size=None):
    if not (isinstance(w, torch.Tensor) and w.dim() == 2 and w.numel() == 0):
        return quantize_absmax(w, bits, granularity, group_size)
    return Quantized(w.to(torch.int8), (w.abs().amax() / qmax(bits)).reshape(1, 1))  # amax of nothing raises


@register("quantization", "mutant_serves_undeclared_bits", devices=("cpu", "cuda"), dtypes=("float64", "float32"),
          mutant=True, bug="declares int8 only and answers any other bit width with int8 codes, silently (as "
          "bitsandbytes' CPU matmul ignores its threshold in its default state)", killed_by=("rejects_bad_input",),
          caps={"symmetric": True, "bits": (8,)})
def mutant_serves_undeclared_bits(w, *, bits, granularity="channel", group_size=None):
    check_inputs(w, bits, granularity, group_size)
    return quantize_absmax(w, 8, granularity, group_size)


def first_block_absmax(w, *, bits, granularity, group_size, block: int) -> Quantized:
    """Per-row (and per-group) absmax over the first ``block`` elements only, as a row-wise kernel whose
    reduction covers one thread block; the per-tensor path is another kernel, and right."""
    if granularity == "tensor":
        return quantize_absmax(w, bits, granularity, group_size)
    g = check_inputs(w, bits, granularity, group_size)
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // g, g)  # (rows, G, g)
    s = blocks[..., :block].abs().amax(dim=-1) / qmax(bits)  # (rows, G): the first block's absmax only
    safe = torch.where(s > 0, s, torch.ones_like(s))[..., None]
    q = torch.round(blocks / safe).clamp(-qmax(bits), qmax(bits))  # the peak past the block clamps
    return Quantized(q.reshape(rows, cols).to(torch.int8), s)


for _block, _killers in ((256, ("long_rows_keep_their_peak", "error_within_half_step")),
                         (1024, ("long_rows_keep_their_peak",))):
    register("quantization", f"mutant_row_absmax_first_{_block}", devices=("cpu", "cuda"),
             dtypes=("float64", "float32"), mutant=True, killed_by=_killers, caps={"symmetric": True},
             bug=f"the row's absmax reduction sees only its first {_block} elements (one thread block): a larger "
                 "element past them is clamped")(
        lambda w, *, bits, granularity="channel", group_size=None, _block=_block: first_block_absmax(
            w, bits=bits, granularity=granularity, group_size=group_size, block=_block))
