"""itertrace.queries"""
