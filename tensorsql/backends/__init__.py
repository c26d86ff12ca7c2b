"""Executors: engines that run finished plans (the embedded DuckDB today; a cluster and GPUs later)."""

from __future__ import annotations
