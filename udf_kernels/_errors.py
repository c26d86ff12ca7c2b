"""Errors of udf_kernels (kept dependency-free: tensorsql wraps them into its own error tree)."""

from __future__ import annotations


class KernelBuildError(RuntimeError):
    """The extension could not be built: headers not found or fetched, compiler missing or failing."""


class KernelLoadError(RuntimeError):
    """The built extension could not be loaded into a DuckDB connection."""
