"""itertrace.profiler"""
