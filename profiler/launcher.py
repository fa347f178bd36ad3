"""Overlap mode's device side for the torch runner: a forward pass runs while the host thread goes on."""
from __future__ import annotations

import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager

import torch
from torch import Tensor

GIL_SWITCH_S = 0.0005  # while a device thread lives: see Launcher._start_thread


class Launcher:
    """Runs forward passes beside the host: on the CPU on a device thread (torch releases the GIL inside its
    ops), on CUDA queued on a stream of its own, the logits copied back into pinned host memory behind an
    event. `launch` returns once the work has started, or, on the CPU, once it is queued behind the one
    running (at most two in flight there: the device thread then goes from one to the next without
    waiting for the host); `collect` waits for the oldest one's result."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: deque[Future | tuple] = deque()  # what collect waits for, oldest first
        self.depth = 2 if device.type == "cpu" else 1  # how many may be in flight
        self._thread: ThreadPoolExecutor | None = None
        self._started = threading.Event()
        self._stream = self._done = None

    def launch(self, work: Callable[[], object], on_device: AbstractContextManager, keep: object) -> None:
        """Run `work` (the swaps and the forward pass; on CUDA it returns the logits) inside `on_device`, on the
        thread or stream that runs device work; `keep` (its inputs) lives until collect."""
        if len(self._pending) >= self.depth:
            raise RuntimeError(f"launch: {len(self._pending)} forward passes in flight, none collected")
        if self.device.type == "cuda":
            self._pending.append(self._on_stream(work, on_device, keep))
            return
        if self._thread is None:
            self._start_thread()
        queued = bool(self._pending)  # it starts when the one in flight ends, on the device thread
        self._started.clear()
        self._pending.append(self._thread.submit(self._on_thread, work, on_device))
        if not queued:
            # Until this thread blocks, the device thread cannot take the GIL to start (the interpreter hands
            # it over only when it forces a switch), and the forward pass would wait for the host's work.
            self._started.wait()

    @property
    def in_flight(self) -> int:
        """Launched and not collected."""
        return len(self._pending)

    def collect(self) -> object:
        """The oldest launched work's result (on CUDA its logits, in pinned host memory)."""
        if not self._pending:
            raise RuntimeError("collect: no forward pass was launched")
        pending = self._pending.popleft()
        if self.device.type == "cuda":
            self._done.synchronize()
            return pending[0]
        return pending.result()

    def _on_thread(self, work: Callable[[], object], on_device: AbstractContextManager) -> object:
        with on_device:
            self._started.set()
            return work()

    def _on_stream(self, work: Callable[[], Tensor], on_device: AbstractContextManager, keep: object) -> tuple:
        """Queue the work after what the current stream holds (prepare's uploads), then the logits' copy."""
        if self._stream is None:
            self._stream, self._done = torch.cuda.Stream(self.device), torch.cuda.Event()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream), on_device:
            logits = work()
            host = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=True)
            host.copy_(logits, non_blocking=True)
            self._done.record(self._stream)
        return host, logits, keep  # alive until the event: memory the stream still reads or writes

    def _start_thread(self) -> None:
        """The device thread, with this thread's torch thread count (OpenMP's count is per thread).

        While it lives the interpreter forces a switch of the GIL after GIL_SWITCH_S instead of 5 ms: a
        small model's forward pass is mostly Python between short ops, and the device thread takes the
        GIL back after each op before a waiting host thread wakes, so the host thread gets it only when
        the interpreter forces a switch.
        """
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="itertrace-device", initializer=torch.set_num_threads,
                                          initargs=(torch.get_num_threads(),))
        weakref.finalize(self, self._thread.shutdown, wait=False)
        weakref.finalize(self, sys.setswitchinterval, sys.getswitchinterval())
        sys.setswitchinterval(GIL_SWITCH_S)
