"""Errors of the shared weight store: one base class, one subclass per failure."""

from __future__ import annotations


class WeightStoreError(Exception):
    """Base of every weight-store failure."""


class UnsupportedModel(WeightStoreError, ValueError):
    """A checkpoint or SGLang model the store cannot lay out (architecture, shape, option)."""


class UnsupportedLevel(WeightStoreError, ValueError):
    """A TP level (or rank) the store was not built for, or cannot serve zero-copy."""


class BindError(WeightStoreError, ValueError):
    """A model's parameters do not match the store (name, shape, dtype, device)."""


class NoGPUError(WeightStoreError, RuntimeError):
    """A CUDA store was asked for on a machine (or process) without a usable GPU."""
