"""Registration of a tiled attention kernel at several (Br, Bc) tile sizes, one name per size.

Each size is its own implementation (`<prefix>_<Br>x<Bc>`), so the property suite runs every size and
the benchmarks compare them; odd sizes that divide nothing test the partial last tiles.
"""

from llm_inference_harness.engine.registry import register


def register_tiles(prefix: str, kernel, tiles: tuple[tuple[int, int], ...], *, io: str, cite: str) -> None:
    """Register kernel(q, k, v, *, causal, scale, Br, Bc) as `<prefix>_<Br>x<Bc>` for every tile size."""
    for Br, Bc in tiles:
        register("attention", f"{prefix}_{Br}x{Bc}", devices=("cpu", "cuda"), cite=cite,
                 caps={"Br": Br, "Bc": Bc, "tiled": True, "io": io}, source=kernel.__module__,
                 )(lambda q, k, v, *, causal=False, scale=None, Br=Br, Bc=Bc: kernel(
                     q, k, v, causal=causal, scale=scale, Br=Br, Bc=Bc))
