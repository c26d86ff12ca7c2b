"""The embedded DuckDB executor: SQL generation, the catalog, ingestion and the run paths."""

from __future__ import annotations
