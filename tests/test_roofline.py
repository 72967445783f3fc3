"""The roofline estimator (harness/analytic/roofline.py): its worked numbers, computed, against worked examples done by
hand."""

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.analytic import roofline
from llm_inference_harness.analytic.iomodel import Memory, fa2_io, standard_io, standard_traffic
from llm_inference_harness.analytic.roofline import (
    DEVICES,
    decode_seconds_per_token,
    flash_kernels,
    measure_cpu,
    standard_kernels,
)


def test_a100_balance_point_is_153_to_156_flop_per_byte():
    assert 153 <= DEVICES["A100-SXM4-80GB"].balance <= 156
    assert all(d.balance > 100 for d in DEVICES.values()), "every GPU here needs > 100 FLOP/B to be compute bound"


def test_balance_points_are_the_datasheets():
    """Dense fp16 tensor FLOP/s over HBM bandwidth: A100 312T / 2.039 and 1.555 TB/s, H100 SXM 989T / 3.35,
    H200 989T / 4.8 (a sparse FLOP figure or a bandwidth copied from another part moves one of these)."""
    assert {name: round(d.balance) for name, d in DEVICES.items()} == {
        "A100-SXM4-80GB": 153, "A100-40GB": 201, "H100-SXM5": 295, "H200-SXM": 206}


def test_qk_intensity_d64_is_about_57_at_N1024_fp16():
    """QK^T does 2N^2 d FLOPs on (2Nd + N^2) fp16 elements: Nd / (2d + N) = 56.9 FLOP/B at N=1024, d=64."""
    qk = standard_kernels(N=1024, d=64, itemsize=2)[0]
    assert round(qk.intensity) == 57
    assert qk.bound(DEVICES["A100-SXM4-80GB"]) == "memory"


def test_7b_fp16_batch1_decode_needs_about_7ms_per_token_on_a100():
    """14 GB of weights read per token: 6.9 ms at the 80GB A100's 2,039 GB/s, 9.0 ms at the 40GB's 1,555."""
    ms = {name: 1e3 * decode_seconds_per_token(7e9, 2, DEVICES[name]) for name in ("A100-SXM4-80GB", "A100-40GB")}
    assert round(ms["A100-SXM4-80GB"]) == 7 and ms["A100-40GB"] >= 7, ms


@given(N=st.integers(1, 64), d=st.integers(1, 32), itemsize=st.sampled_from([1, 2, 4]))
def test_kernel_bytes_are_the_io_models_traffic(N, d, itemsize):
    """The three standard kernels move 4N^2 + 4Nd elements and the flash kernel FA-2's count, as the
    twins count them (run on the meta device)."""
    Q = K = V = torch.empty(N, d, device="meta")
    standard = sum(k.bytes for k in standard_kernels(N, d, itemsize))
    assert standard == standard_io(Q, K, V, Memory())[-1].traffic * itemsize == standard_traffic(N, N, d) * itemsize
    flash = flash_kernels(N, d, Br=16, itemsize=itemsize)[0].bytes
    assert flash == fa2_io(Q, K, V, Memory(), Br=16, Bc=16)[-1].traffic * itemsize
    assert math.isclose(sum(k.flops for k in standard_kernels(N, d)), flash_kernels(N, d)[0].flops)


def test_flash_is_faster_than_standard_on_every_gpu_at_the_seeds_size():
    for device in DEVICES.values():
        standard = sum(k.seconds(device) for k in standard_kernels(4096, 128))
        flash = sum(k.seconds(device) for k in flash_kernels(4096, 128, Br=128))
        assert flash < standard, f"{device.name}: flash {flash:.3g} s is not below standard {standard:.3g} s"


def test_cpu_ceilings_are_measured():
    cpu = measure_cpu(n=256, copy_mb=8, repeats=2)
    assert math.isfinite(cpu.flops) and cpu.flops > 0 and math.isfinite(cpu.bandwidth) and cpu.bandwidth > 0


def test_cpu_ceilings_count_2n3_flops_and_both_copy_directions(monkeypatch):
    """With every timing read as 1 s, the ceilings are the counts: 2n^3 for an n x n matmul, and a copy
    of 1 MiB moves 2 MiB (read and write)."""
    monkeypatch.setattr(roofline, "_seconds", lambda fn: 1.0)
    cpu = measure_cpu(n=4, copy_mb=1, repeats=1)
    assert (cpu.flops, cpu.bandwidth) == (2 * 4**3, 2 * 2**20)


def test_decode_time_scales_with_bytes_per_weight():
    a100 = DEVICES["A100-SXM4-80GB"]
    assert [decode_seconds_per_token(7e9, size, a100) for size in (1, 2)] == [7e9 / 2039e9, 14e9 / 2039e9]
