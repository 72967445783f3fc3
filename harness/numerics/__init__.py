"""Arithmetic shared by implementations and references: the online-softmax merge of partial results
(Milakov and Gimelshein 2018) and reductions in a fixed order (batch-invariant kernels).

The bottom layer: imports nothing of the harness.
"""
