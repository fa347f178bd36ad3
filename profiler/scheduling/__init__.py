"""The scheduler and what it decides with: requests, KV blocks, policies, budgets, batches. No torch."""
