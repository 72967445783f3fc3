"""Activation checkpointing (gradient checkpointing) on a toy layer stack."""
