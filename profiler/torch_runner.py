"""The torch runner's former place, which overlap_experiment.py still imports; it lives in runners/torch/."""
from itertrace.profiler.runners.torch.torch_runner import TorchRunner

__all__ = ["TorchRunner"]
