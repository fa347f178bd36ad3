"""The torch runner: a transformer over a paged KV cache, its sampler and its device thread."""
