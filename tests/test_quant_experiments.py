"""Outlier injection (harness/analytic/quant_experiments.py): SmoothQuant's equivalence (Xiao et al. 2023,
Sec. 3) moves a channel's scale between a LayerNorm and the next Linear without changing the function.
"""

import pytest
import torch

from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY


# ---------------------------------------------------------------------------------------------
# outlier injection (harness/analytic/quant_experiments.py)
@pytest.mark.parametrize(("seed", "channel", "factor"), [(0, 0, 10.0), (1, 17, 100.0), (2, 31, 1000.0)])
def test_outlier_injection_preserves_the_function(seed, channel, factor):
    """Scaling a LayerNorm channel by c and the next Linear's input column by 1/c leaves the logits
    unchanged (float64), while that Linear's input gets a channel c times larger than before."""
    from llm_inference_harness.analytic.quant_experiments import block_linears, inject_outlier, input_absmax
    from llm_inference_harness.models.gpt import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_kv_head=2, n_embd=32)).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # LayerNorms start at (1, 0): make the injected bias matter too
            p.add_(0.1 * torch.randn_like(p))
    injected, _ = inject_outlier(model, layer=1, factor=factor, channel=channel)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        before, after = model(idx), injected(idx)
    err = (after - before).abs().max().item()
    assert err <= FLOAT64_IDENTITY * max(1.0, before.abs().max().item()), f"injection changed the logits by {err:.3g}"
    docs = idx.tolist()
    ffn_in = next(i for i, (parent, name) in enumerate(block_linears(injected))
                  if parent is injected.blocks[1].mlp and name == "0")
    grown = input_absmax(injected, docs)[ffn_in][channel] / input_absmax(model, docs)[ffn_in][channel]
    assert abs(grown.item() - factor) <= FLOAT64_IDENTITY * factor, \
        f"the channel grew by {grown.item():.6g}, not {factor:g}"


def test_outlier_injection_keeps_the_target_nll():
    """SmoothQuant's equivalence (Xiao et al. 2023, Sec. 3) on the trained target: LayerNorm channel x100, FFN
    column / 100, same NLL."""
    from llm_inference_harness.analytic.quant_experiments import inject_outlier
    from llm_inference_harness.models.zoo import WEIGHTS, load, nll_per_token, test_corpus

    if not (WEIGHTS / "target.safetensors").exists():
        pytest.skip("the target model's weights are not built (python -m llm_inference_harness.models.train)")
    target, docs = load("target").double(), test_corpus(20)
    injected, _ = inject_outlier(target)
    before, after = nll_per_token(target, docs), nll_per_token(injected, docs)
    assert abs(after - before) <= FLOAT64_IDENTITY * before, f"NLL moved from {before!r} to {after!r}"
