"""Plugins that break their contract in the ways the guard must report, one per function: for attention one
of each kind and one that keeps the contract, then the ones that try to escape their checking process, then
one for every other technique (each a real bug's shape).  tests/test_plugin_verdicts.py checks that each gets
its own verdict and the run goes on; plugins that misbehave at import are modules of their own (tests/plugins/)."""

import os
import signal
import subprocess
import sys
import time

import torch

from llm_inference_harness.engine.plugins import declare
from llm_inference_harness.impls.attention.naive import naive_attention
from llm_inference_harness.impls.attention_backward.naive import naive_attention_backward
from llm_inference_harness.impls.block_manager.simple import SimpleBlockManager
from llm_inference_harness.impls.kvcache.concat import ConcatDecoder
from llm_inference_harness.impls.paged_attention.gather import gather_then_attend
from llm_inference_harness.impls.quantization.absmax import absmax
from llm_inference_harness.impls.quantized_linear.w8a8 import w8a8_linear
from llm_inference_harness.impls.speculative.standard import speculative


def correct(q, k, v, *, causal=False, scale=None):
    return naive_attention(q, k, v, causal=causal, scale=scale)


def raises(q, k, v, *, causal=False, scale=None):
    raise RuntimeError("boom")


@declare(caps={"call_limit_s": 1})
def hangs(q, k, v, *, causal=False, scale=None):
    time.sleep(3600)


def nan(q, k, v, *, causal=False, scale=None):
    return torch.full_like(q, float("nan"))


def zeros(q, k, v, *, causal=False, scale=None):
    return torch.zeros_like(q)


def wrong_shape(q, k, v, *, causal=False, scale=None):
    return naive_attention(q, k, v, causal=causal, scale=scale)[..., :1]


def mutates(q, k, v, *, causal=False, scale=None):
    out = naive_attention(q, k, v, causal=causal, scale=scale)
    k.mul_(2)
    return out


def crashes(q, k, v, *, causal=False, scale=None):
    os._exit(3)


# ---- escapes: what a call does to get past the per-call limit, the memory, the output or the process ----


@declare(caps={"call_limit_s": 1})
def hangs_catching_everything(q, k, v, *, causal=False, scale=None):
    while True:  # the alarm's exception is caught and the loop goes on
        try:
            time.sleep(3600)
        except BaseException:  # noqa: BLE001, S110 - the escape being tested
            pass


@declare(caps={"call_limit_s": 1})
def hangs_resetting_the_timer(q, k, v, *, causal=False, scale=None):
    signal.setitimer(signal.ITIMER_REAL, 0)  # no alarm will come
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(3600)


@declare(caps={"call_limit_s": 600})
def sleeps(q, k, v, *, causal=False, scale=None):
    """A slow call within its limit: what Ctrl-C interrupts."""
    time.sleep(600)


def hogs_memory(q, k, v, *, causal=False, scale=None):
    hoard = []
    while True:  # touched pages, as a runaway cache would
        hoard.append(bytearray(64 * 2**20))


def prints_a_lot(q, k, v, *, causal=False, scale=None):
    sys.stdout.write("x" * 2**20 + "\n")  # 1 MiB a call
    print("debug: the last line a plugin printed", file=sys.stderr)
    return naive_attention(q, k, v, causal=causal, scale=scale)


def spawns_a_grandchild(q, k, v, *, causal=False, scale=None):
    subprocess.Popen(["sleep", "300"])  # inherits stdout: a pipe reader would wait for it
    return naive_attention(q, k, v, causal=causal, scale=scale)


def changes_default_dtype(q, k, v, *, causal=False, scale=None):
    torch.set_default_dtype(torch.float64)
    return naive_attention(q, k, v, causal=causal, scale=scale)


def seeds_torch(q, k, v, *, causal=False, scale=None):
    torch.manual_seed(0)  # reproducible for the plugin, every later random draw of the caller replayed
    return naive_attention(q, k, v, causal=causal, scale=scale)


def sets_threads(q, k, v, *, causal=False, scale=None):
    torch.set_num_threads(torch.get_num_threads() + 1)
    return naive_attention(q, k, v, causal=causal, scale=scale)


def leaves_grad_off(q, k, v, *, causal=False, scale=None):
    torch.set_grad_enabled(False)
    return naive_attention(q, k, v, causal=causal, scale=scale)


# ---- one for every other technique ------------------------------------------------------------------


def backward_two_gradients(q, k, v, o, lse, do, *, causal=False, scale=None):
    return naive_attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale)[:2]  # dv forgotten


def paged_advances_seq_lens(q, k_cache, v_cache, block_tables, seq_lens, *, causal=False, scale=None):
    out = gather_then_attend(q, k_cache, v_cache, block_tables, seq_lens, causal=causal, scale=scale)
    seq_lens += 1  # the decode loop's "one more token" done inside the kernel, on the caller's tensor
    return out


@declare(dtypes=("float64", "float32"), caps={"call_limit_s": 1})
class KVStepHangs(ConcatDecoder):
    def step(self, tokens):
        time.sleep(3600)


class BlockManagerKeepsTokens(SimpleBlockManager):
    """Keeps the caller's token list as its own and appends to it: the caller's prompt grows."""

    def allocate(self, seq_id, tokens):
        cached = super().allocate(seq_id, tokens)
        self.seqs[seq_id].tokens = tokens
        return cached


@declare(dtypes=("float64", "float32"))
def quantization_nan_scale(w, *, bits, granularity="channel", group_size=None):
    codes, scale, zero = absmax(w, bits=bits, granularity=granularity, group_size=group_size)
    return codes, torch.where(scale > 0, scale, float("nan")), zero  # an all-zero group's scale left as 0/0


@declare(dtypes=("float64", "float32"))
def linear_transposed(x, w, *, bits=8, calib=None):
    return w8a8_linear(x, w, bits=bits, calib=calib).transpose(-1, -2)  # (out, tokens)


@declare(dtypes=("float64",))
def speculative_extends_prompt(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    generation = speculative(target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens, rng=rng, eos=eos)
    prompt += generation.tokens  # ctx = prompt; ctx += ... on the caller's list
    return generation


@declare(dtypes=("float64",))
def speculative_edits_its_draft(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    generation = speculative(target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens, rng=rng, eos=eos)
    draft.table.copy_(draft.table.flip(-1))  # a "tuned" draft written back into the caller's model
    return generation
