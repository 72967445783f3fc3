"""Float64 oracles, one section per technique. Properties compare against these."""

from __future__ import annotations

import math

import torch

from harness.contracts.attention import causal_allowed, check_inputs
from harness.contracts.quantization import Quantized, dequantize, qmax, scale_shape, step_per_element
from harness.contracts.quantized_linear import Scheme


# ---------------------------------------------------------------------------------------------
# attention
def attention64(q, k, v, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v in float64, straight from the definition; masked-out rows give 0."""
    scale = check_inputs(q, k, v, scale, causal)
    q, k, v = q.double(), k.double(), v.double()
    s = _scores(q, k, scale, causal)  # (B, Hkv, G, Nq, Nk)
    return (_softmax_rows(s) @ v[:, :, None]).reshape(q.shape)  # (B, H, Nq, d)


PLAIN_ORDERS = 4  # operation orders of attention_plain


def attention_plain(q, k, v, *, causal: bool = False, scale: float | None = None) -> list[torch.Tensor]:
    """The 'plain computations' that earn tolerances: the formula carried out in the inputs' own dtype
    in four mathematically identical operation orders (d summed in reverse; q scaled before the
    product; d split in two halves; base-2 scores s * log2(e) and exp2, as FlashAttention-2's kernels
    compute them, which rounds every score once more), normalizing before or after the product with v.
    The largest of their distances from the reference is an honest sample of that dtype's rounding
    error: never the zero that re-running the reference's own order gives in float64, and not one
    lucky draw either."""
    scale = check_inputs(q, k, v, scale, causal)
    h = q.shape[-1] // 2
    orders = [
        (_scores(q.flip(-1), k.flip(-1), scale, causal), False, torch.exp),
        (_scores(q * scale, k, 1.0, causal), True, torch.exp),
        (_scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal), False,
         torch.exp),
        (_scores(q, k, scale * math.log2(math.e), causal), False, torch.exp2),
    ]
    return [_softmax_v(s, v, normalize_first, exp) for s, normalize_first, exp in orders]


def attention_score_conditioning(q, k, v, *, causal: bool = False, scale: float | None = None) -> float:
    """First-order bound on the output error that rounding the scores alone causes in q's dtype.

    A dot product of length d carries |ds_ij| <= gamma_d * scale * sum_c |q_ic k_jc| with
    gamma_d = d u / (1 - d u) (Higham, Accuracy and Stability, Thm 3.5), plus u |s_ij| for the
    scaling.  Softmax turns it into do_i = sum_j p_ij ds_ij (v_j - o_i); the factor e^(2 max|ds|)
    covers the second-order terms.  At logits of 1e3-1e4 this term, not the arithmetic after it,
    dominates every correct kernel's error, and it differs from draw to draw of the operation order.
    Any weights give a convex combination of the visible v_j, so max_j |v_j - o_i| caps the bound
    where e^(2 max|ds|) overflows (low precision at huge logits), and one visible key gives 0.
    """
    scale = check_inputs(q, k, v, scale, causal)
    u = torch.finfo(q.dtype).eps / 2
    d = q.shape[-1]
    gamma = d * u / (1 - d * u)
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = _scores(q64, k64, scale, causal)  # (B, Hkv, G, Nq, Nk)
    ds = gamma * abs(scale) * _scores(q64.abs(), k64.abs(), 1.0, False) + u * s.abs().nan_to_num(0, 0, 0)
    p = _softmax_rows(s)
    o = p @ v64[:, :, None]  # (B, Hkv, G, Nq, d)
    spread = (v64[:, :, None, None] - o[..., None, :]).abs()  # (B, Hkv, G, Nq, Nk, d): |v_j - o_i|
    first_order = ((p * ds)[..., None] * spread).sum(dim=-2)  # (B, Hkv, G, Nq, d)
    if not first_order.numel():
        return 0.0
    worst = ds.masked_fill(p == 0, 0).max().item()
    growth = torch.tensor(2 * worst, dtype=torch.float64).exp()  # inf past e^709
    hull = spread.masked_fill(~torch.isfinite(s)[..., None], 0).amax(dim=-2)  # (B, Hkv, G, Nq, d)
    return torch.where(first_order > 0, first_order * growth, 0).minimum(hull).max().item()


def _softmax_rows(s: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim; a row that sees no key (all -inf) is 0, as the contract says.  Not
    nan_to_num: a NaN that came from the inputs stays NaN, never a silent 0."""
    return torch.where((s == float("-inf")).all(dim=-1, keepdim=True), 0.0, torch.softmax(s, dim=-1))


def _softmax_v(s: torch.Tensor, v: torch.Tensor, normalize_first: bool, exp=torch.exp) -> torch.Tensor:
    m = s.amax(dim=-1, keepdim=True)
    p = exp(s - torch.where(torch.isfinite(m), m, 0))  # (B, Hkv, G, Nq, Nk)
    l = p.sum(dim=-1, keepdim=True)  # noqa: E741
    l = torch.where(l > 0, l, 1)  # noqa: E741 - rows that see no key stay 0
    out = (p / l) @ v[:, :, None] if normalize_first else (p @ v[:, :, None]) / l  # (B, Hkv, G, Nq, d)
    B, Hkv, G, Nq, d = out.shape
    return out.reshape(B, Hkv * G, Nq, d)  # (B, H, Nq, d)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d): query head h reads kv head h // G
    s = (qg @ k[:, :, None].transpose(-1, -2)) * scale  # (B, Hkv, G, Nq, Nk)
    return s.masked_fill(~causal_allowed(Nq, Nk, device=q.device), float("-inf")) if causal else s


# ---------------------------------------------------------------------------------------------
# attention_backward
def attention_lse64(q, k, v, *, causal: bool = False, scale: float | None = None):
    """(o, L) in float64: the forward output and L_i = logsumexp_j of the scaled, masked scores (-inf: no key)."""
    scale = check_inputs(q, k, v, scale, causal)
    s = _scores(q.double(), k.double(), scale, causal)  # (B, Hkv, G, Nq, Nk)
    return attention64(q, k, v, causal=causal, scale=scale), torch.logsumexp(s, dim=-1).reshape(q.shape[:-1])


def attention_lse_plain(q, k, v, *, causal: bool = False, scale: float | None = None) -> list[torch.Tensor]:
    """L carried out in the inputs' own dtype, in the four score orders of `attention_plain`."""
    scale = check_inputs(q, k, v, scale, causal)
    h = q.shape[-1] // 2
    orders = [_scores(q.flip(-1), k.flip(-1), scale, causal), _scores(q * scale, k, 1.0, causal),
              _scores(q[..., :h], k[..., :h], scale, False) + _scores(q[..., h:], k[..., h:], scale, causal)]
    s2 = _scores(q, k, scale * math.log2(math.e), causal)  # base 2: L = ln 2 * (m2 + log2 sum 2^(s2 - m2))
    m2 = s2.amax(dim=-1, keepdim=True)
    m2 = torch.where(torch.isfinite(m2), m2, 0)  # rows that see no key: log2(0) = -inf below
    base2 = (torch.exp2(s2 - m2).sum(dim=-1, keepdim=True).log2() + m2) * math.log(2)
    return [torch.logsumexp(s, dim=-1).reshape(q.shape[:-1]) for s in orders] + [base2.reshape(q.shape[:-1])]


def attention_backward64(q, k, v, do, *, causal: bool = False, scale: float | None = None):
    """(dq, dk, dv) in float64 by autograd through `attention64`: the oracle of the backward."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = attention64(q64, k64, v64, causal=causal, scale=scale)
    return torch.autograd.grad(o, (q64, k64, v64), do.double())


def attention_backward_plain(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None):
    """The plain backward (P, dV = P^T dO, dP = dO V^T, dS = P (dP - D), dQ = dS K, dK = dS^T Q) in the
    inputs' own dtype, in six operation orders.  Five go FlashAttention's way, P = exp(S - L) from the
    forward's L and D = rowsum(dO o O), with every sum over d (scores, dP, D) cut up as the order says:
    reversed, as is, in halves, shuffled, shuffled halves; D's products rounded before the sum (a rowsum) or
    fused into it (a GEMM).  P is never renormalized, so the rounding of S and L reaches it (one visible key:
    P is 1 only up to it), as in every kernel that recomputes P; and where dS = P (dP - D) cancels (one
    visible key: exactly), the error is that of dP - D alone, a quantity whose size varies a lot from order
    to order: five draws of it make the largest a stable measure.  The sixth is the textbook order,
    P = softmax(q scaled first) and D = rowsum(P o dP).  The scale is applied before or after the product
    with K/Q.  Returns a list of (dq, dk, dv): the samples that earn the gradient tolerance."""
    scale = check_inputs(q, k, v, scale, causal)
    (B, H, Nq, d), (Hkv, Nk) = q.shape, k.shape[1:3]
    h = d // 2
    qg, og, dog = (t.reshape(B, Hkv, H // Hkv, Nq, d) for t in (q, o, do))  # (B, Hkv, G, Nq, d)
    kg, vg = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, Nk, d)
    L = lse.reshape(B, Hkv, H // Hkv, Nq, 1)  # (B, Hkv, G, Nq, 1) as delivered: -inf on rows that see no key
    hidden = ~causal_allowed(Nq, Nk, device=q.device) if causal else torch.zeros(Nq, Nk, dtype=torch.bool,
                                                                                  device=q.device)
    perm = torch.randperm(d, generator=torch.Generator().manual_seed(d)).to(q.device)  # a fixed shuffle of d
    cuts = {"reversed": lambda t: [t.flip(-1)], "as is": lambda t: [t], "halves": lambda t: [t[..., :h], t[..., h:]],
            "shuffled": lambda t: [t[..., perm]], "shuffled halves": lambda t: [t[..., perm[:h]], t[..., perm[h:]]]}
    orders = [("reversed", "rowsum"), ("as is", "GEMM"), ("halves", "rowsum"), ("shuffled", "GEMM"),
              ("shuffled halves", "rowsum"), ("as is", "P.dP")]

    def pieces(cut, a, b):  # the matching pieces of d of two tensors
        return zip(cuts[cut](a), cuts[cut](b), strict=True)

    def dot(cut, a, b):  # (.., M, d), (.., N, d) -> (.., M, N), summed over d piece by piece
        return sum(x @ y.transpose(-1, -2) for x, y in pieces(cut, a, b))

    grads = []
    for n, (cut, delta) in enumerate(orders):
        if delta == "P.dP":
            p = _softmax_rows(_scores(q * scale, k, 1.0, causal))  # (B, Hkv, G, Nq, Nk)
        else:  # FlashAttention: P recomputed from L; exp(-inf) = 0 on hidden keys and rows that see none
            s = (dot(cut, qg, kg) * scale).masked_fill(hidden, float("-inf"))  # (B, Hkv, G, Nq, Nk)
            p = torch.exp(s - torch.where(torch.isfinite(L), L, 0)).to(q.dtype)
        dv = (p.transpose(-1, -2) @ dog).sum(dim=2)  # (B, Hkv, Nk, d): summed over the G query heads
        dp = dot(cut, dog, vg)  # (B, Hkv, G, Nq, Nk)
        if delta == "P.dP":
            D = (p * dp).sum(-1, keepdim=True)  # (B, Hkv, G, Nq, 1)
        elif delta == "GEMM":
            D = sum(x[..., None, :] @ y[..., :, None] for x, y in pieces(cut, dog, og))[..., 0]  # products fused
        else:
            D = sum((x * y).sum(-1, keepdim=True) for x, y in pieces(cut, dog, og))  # products rounded, then summed
        ds = p * (dp - D)  # (B, Hkv, G, Nq, Nk)
        scale_first = n % 2 == 0
        ds = ds * scale if scale_first else ds
        dq, dk = ds @ kg, (ds.transpose(-1, -2) @ qg).sum(dim=2)  # (B, Hkv, G, Nq, d), (B, Hkv, Nk, d)
        if not scale_first:
            dq, dk = dq * scale, dk * scale
        grads.append((dq.reshape(q.shape), dk, dv))
    return grads


def attention_probs64(q, k, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """P = softmax(scale q k^T) in float64, (B, Hkv, G, Nq, Nk); rows that see no key are 0."""
    scale = check_inputs(q, k, k, scale, causal)
    return _softmax_rows(_scores(q.double(), k.double(), scale, causal))


# ---------------------------------------------------------------------------------------------
# quantization
def quantize64(w: torch.Tensor, bits: int, granularity: str, group_size: int | None = None) -> Quantized:
    """Symmetric absmax from the definition, in float64: s = max|w| / (2^(b-1) - 1), q = round(w / s)."""
    w = w.double()
    rows, cols = w.shape
    blocks = w.reshape(*scale_shape(w, granularity, group_size), -1)  # (R, G, elements per scale)
    s = blocks.abs().amax(dim=-1) / qmax(bits)  # (R, G)
    q = torch.where(s[..., None] > 0, blocks / s[..., None], 0.0).round()
    return Quantized(q.reshape(rows, cols).to(torch.int64), s)


def zero_point_quantize64(w: torch.Tensor, bits: int, granularity: str, group_size: int | None = None) -> Quantized:
    """Asymmetric quantization from the contract's definition, in float64: s = (max(w, 0) - min(w, 0)) /
    (2^b - 1) and z = round(-min(w, 0) / s) per group (z = 0 where s = 0), codes clamp(round(w / s) + z)."""
    w = w.double()
    rows, cols = w.shape
    blocks = w.reshape(*scale_shape(w, granularity, group_size), -1)  # (R, G, elements per scale)
    lo, hi = blocks.amin(dim=-1).clamp(max=0), blocks.amax(dim=-1).clamp(min=0)  # (R, G)
    s = (hi - lo) / (2**bits - 1)
    safe = torch.where(s > 0, s, 1.0)
    z = torch.round(-lo / safe)  # (R, G)
    q = (torch.round(blocks / safe[..., None]) + z[..., None]).clamp(0, 2**bits - 1)  # (R, G, elements per scale)
    return Quantized(q.reshape(rows, cols).to(torch.int64), s, z.to(torch.int64))


def smoothing_factors64(act_absmax: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's s_j = max|X_j|^a / max|W_j|^(1-a), 1 where a channel of X or W is all zero."""
    a, m = act_absmax.double(), w.double().abs().amax(dim=0)  # (in,), (in,)
    ok = (a > 0) & (m > 0)
    return torch.where(ok, a.clamp(min=1e-300) ** alpha / m.clamp(min=1e-300) ** (1 - alpha), 1.0)


def _split(x, w, scheme: Scheme, calib):
    """(x, w) with LLM.int8()'s outlier columns removed and SmoothQuant's factors applied, in float64,
    and the float64 product of the outlier columns."""
    x2, w = x.reshape(-1, x.shape[-1]).double(), w.double()  # (n, in)
    y_outliers = torch.zeros(x2.shape[0], w.shape[0], dtype=torch.float64, device=x.device)  # (n, out)
    if scheme.outlier_threshold is not None:
        cols = (x2.abs() > scheme.outlier_threshold).any(dim=0)  # (in,)
        y_outliers = x2[:, cols] @ w[:, cols].T
        x2, w = x2 * ~cols, w * ~cols
    if scheme.smooth_alpha is not None:
        stats = (x2 if calib is None else calib.double()).abs().amax(dim=0)  # (in,)
        s = smoothing_factors64(stats, w, scheme.smooth_alpha)
        x2, w = x2 / s, w * s
    return x2, w, y_outliers


def _quantized_operands(x2, w, bits: int, scheme: Scheme):
    qw = quantize64(w, bits, scheme.weight, scheme.group_size)
    qx = None if scheme.act is None else quantize64(x2, bits, "tensor" if scheme.act == "tensor" else "channel")
    return qx, qw


def quantized_linear64(x, w, *, bits: int, scheme: Scheme, calib=None) -> torch.Tensor:
    """The scheme's dequantized computation in float64: y = x_O @ w_O.T + dq(q(x')) @ dq(q(w')).T."""
    x2, w2, y = _split(x, w, scheme, calib)
    qx, qw = _quantized_operands(x2, w2, bits, scheme)
    x_hat = x2 if qx is None else dequantize(qx)
    return (y + x_hat @ dequantize(qw).T).reshape(*x.shape[:-1], w.shape[0])  # (..., out)


def quantized_linear_plain(x, w, *, bits: int, scheme: Scheme, calib=None) -> list[torch.Tensor]:
    """Two float64 orders of the same computation (integer products first, then the scales; and the
    columns summed in reverse): their distance from quantized_linear64 is float64 rounding."""
    x2, w2, y = _split(x, w, scheme, calib)
    qx, qw = _quantized_operands(x2, w2, bits, scheme)
    w_hat = dequantize(qw)
    x_hat = x2 if qx is None else dequantize(qx)
    orders = [x_hat.flip(-1) @ w_hat.flip(-1).T]
    if scheme.weight != "group":  # one scale per output: integer (or unscaled) products first, then scales
        x_codes, x_scale = (x2, 1.0) if qx is None else (qx.codes.double(), qx.scale)
        orders.append((x_codes @ qw.codes.double().T) * x_scale * qw.scale.T)
    return [(y + o).reshape(*x.shape[:-1], w.shape[0]) for o in orders]


def quantized_linear_error_bound(x, w, *, bits: int, scheme: Scheme, calib=None) -> torch.Tensor:
    """|y - x @ w.T| <= sum_k |x_k| dw_k + dx_k |w_k| + dx_k dw_k (exact arithmetic), where dw, dx are the
    per-element steps / 2 of the scheme's scales; outlier columns contribute nothing (computed in float)."""
    x2, w2, _ = _split(x, w, scheme, calib)
    qx, qw = _quantized_operands(x2, w2, bits, scheme)
    dw = step_per_element(qw) / 2  # (out, in)
    dx = torch.zeros_like(x2) if qx is None else step_per_element(qx).expand_as(x2) / 2  # (n, in)
    bound = x2.abs() @ dw.T + dx @ w2.abs().T + dx @ dw.T  # (n, out)
    return bound.reshape(*x.shape[:-1], w.shape[0])


def quantized_linear_tie_bound(x, w, *, bits: int, scheme: Scheme, calib=None, rel: float) -> torch.Tensor:
    """How far codes rounded the other way can move y: computed in a lower precision, a value within ``rel``
    (relative) of a rounding tie, in units of its step, may get either code.  Each such weight moves y by one
    step times |x_hat|, each such activation by one step times |w_hat|; (..., out)."""
    x2, w2, _ = _split(x, w, scheme, calib)
    qx, qw = _quantized_operands(x2, w2, bits, scheme)

    def tied_steps(values, q):  # the step of every element within rel of a tie, else 0
        step = step_per_element(q).expand_as(values)
        r = values / step.clamp(min=1e-300)  # the value in steps
        return torch.where((r - r.floor() - 0.5).abs() <= rel * (r.abs() + 1), step, 0.0)

    dw = step_per_element(qw) / 2  # (out, in)
    dx = torch.zeros_like(x2) if qx is None else step_per_element(qx).expand_as(x2) / 2  # (n, in)
    bound = (x2.abs() + dx) @ tied_steps(w2, qw).T  # (n, out)
    if qx is not None:
        bound = bound + tied_steps(x2, qx) @ (w2.abs() + dw).T
    return bound.reshape(*x.shape[:-1], w.shape[0])


# ---------------------------------------------------------------------------------------------
# speculative decoding
def autoregressive_distribution(target, prompt, T: int, eos: int | None = None) -> dict[tuple[int, ...], float]:
    """P(first T tokens) of sampling from the target, by expanding every sequence (float64; a sequence
    ends early at eos).  Zero-probability continuations are left out."""
    dist = {(): 1.0}
    for _ in range(T):
        grown: dict[tuple[int, ...], float] = {}
        for seq, prob in dist.items():
            if seq and seq[-1] == eos:
                grown[seq] = prob
                continue
            p = target([[*prompt, *seq]])[0, -1].tolist()
            for token, pt in enumerate(p):
                if pt > 0:
                    grown[(*seq, token)] = prob * pt
        dist = grown
    return dist


def greedy_tokens(target, prompt, T: int, eos: int | None = None) -> list[int]:
    """The target's greedy continuation (argmax, ties to the lowest id), stopping at eos."""
    out: list[int] = []
    while len(out) < T and (not out or out[-1] != eos):
        out.append(int(target([[*prompt, *out]])[0, -1].argmax()))
    return out


# ---------------------------------------------------------------------------------------------
# kvcache: full forward passes of a harness GPT (no cache), in float64 and in the model's own dtype
def gpt_logits64(model, seq: torch.Tensor, kv_bits: int | None = None) -> torch.Tensor:
    """Logits (T, V) of one sequence, weights (as stored) promoted to float64, attention from the definition.
    ``kv_bits``: round-trip every key/value vector through symmetric absmax integers of that many bits
    first (what a quantized cache stores), so the result is the exact forward of a quantized cache."""
    import copy

    model64 = copy.deepcopy(model).double()

    def attend(layer, q, k, v):
        if kv_bits is not None:
            k, v = _absmax_roundtrip(k, kv_bits), _absmax_roundtrip(v, kv_bits)
        return attention64(q, k, v, causal=True)

    with torch.no_grad():
        return model64.forward_with(seq[None], None, attend)[0]


def gpt_logits_plain(model, seq: torch.Tensor) -> list[torch.Tensor]:
    """The full forward in the model's own dtype, with attention in each of attention_plain's orders."""
    with torch.no_grad():
        return [model.forward_with(seq[None], None,
                                   lambda layer, q, k, v, i=i: attention_plain(q, k, v, causal=True)[i])[0]
                for i in range(PLAIN_ORDERS)]


def _absmax_roundtrip(x: torch.Tensor, bits: int) -> torch.Tensor:
    top = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=-1, keepdim=True) / top  # one scale per vector
    return torch.where(scale > 0, torch.round(x / torch.where(scale > 0, scale, 1)).clamp(-top, top) * scale, 0)
