"""itertrace: iteration-level traces of LLM inference engines."""
__version__ = "0.1.0"
