"""Analytic models: the attention IO model and roofline (iomodel, roofline), KV-cache sizes (kvsize),
activation checkpointing (checkpointing), the paged-serving simulator (simulator/) and the quantization
experiments on the tiny target model (quant_experiments).

May import numerics, the engine's core and registry, models, sampling and contracts; nothing of bench or the CLI.
"""
