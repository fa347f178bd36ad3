"""A small live run of the torch runner on the CPU under `itertrace run --torch-profile`, made once per session."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from itertrace.cli import main

# Six requests through four slots: a queue, prefill chunks beside decodes, every request finishing.
RUN_ARGS = ("run", "--runner", "torch", "--workload", "synthetic", "--num-requests", "6", "--prompt-len", "24",
            "--output-len", "choice:3,9@0.5,0.5", "--capacity", "4", "--token-budget", "32", "--hidden", "64",
            "--layers", "1", "--heads", "2", "--kv-heads", "2", "--intermediate", "128", "--format", "json")


@dataclass(frozen=True)
class ProfiledRun:
    run_dir: Path
    trace: Path


_made: list[ProfiledRun] = []


def profiled_run(tmp_path_factory) -> ProfiledRun:
    """The run directory and its torch.profiler trace (the first caller's temporary folder holds them)."""
    if not _made:
        folder = tmp_path_factory.mktemp("profiled")
        assert main([*RUN_ARGS, "--out", str(folder / "run"), "--torch-profile", str(folder / "torch")]) == 0
        _made.append(ProfiledRun(folder / "run", folder / "torch" / "trace.json.gz"))
    return _made[0]
