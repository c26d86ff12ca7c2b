"""Executors: engines that run finished plans (the embedded DuckDB today; a cluster and GPUs later)."""
