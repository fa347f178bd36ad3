"""What runs a batch: the simulated runner and its calibration; the torch model under torch/."""
