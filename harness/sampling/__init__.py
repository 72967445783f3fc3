"""Samplers' shared machinery: the language-model and randomness protocols (lm), exact enumeration of every
random branch (enumeration) and the runs of a sampler along scripted paths it asks for (replay: here, or in the
implementation's own process over the engine's wire), goodness-of-fit tests (statistical), the speculative
speedup calculator (speedup), draft models (drafts/) and measured sampling runs on the tiny models (measure).

May import numerics, the engine's core and models; the contracts import it (the speculative contract is written
against `lm.LM`).
"""
