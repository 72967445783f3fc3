"""Implementations, one file each, grouped by technique. Importing a module registers it."""
