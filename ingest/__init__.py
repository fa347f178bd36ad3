"""itertrace.ingest"""
