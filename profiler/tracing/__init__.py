"""What a run leaves behind: NVTX ranges, torch.profiler ranges, run logs and the engine's books."""
