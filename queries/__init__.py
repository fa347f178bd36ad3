"""itertrace.queries: SQL modules (`*.sql`) over an ingested database, and the code that installs and runs them."""
from itertrace.queries.api import QueryDB, connect, install, set_params
from itertrace.queries.catalog import queries

__all__ = ["QueryDB", "connect", "install", "queries", "set_params"]
