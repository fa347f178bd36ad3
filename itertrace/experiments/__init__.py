"""Experiments that run the engine and read its runs back through ingest and the query library."""
