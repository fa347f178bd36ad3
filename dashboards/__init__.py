"""itertrace.dashboards"""
