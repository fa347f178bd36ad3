"""Overlap mode's device side for the torch runner: a forward pass runs while the host thread goes on."""
from __future__ import annotations

import queue
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from itertrace.interrupts import deferred

GIL_SWITCH_S = 0.0005  # while a device thread lives: see Launcher._start_thread


class Launcher:
    """Runs forward passes beside the host: on the CPU on a device thread (torch releases the GIL inside its
    ops, a TorchScript call for all of them: see scripted_decode), on CUDA queued on a stream of its own,
    the logits copied back into pinned host memory behind an event. `launch` returns once the work has
    started, or, on the CPU, once it is queued behind the one running (at most two in flight there: the
    device thread then goes from one to the next without waiting for the host); `collect` waits for the
    oldest one's result."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: deque[Future | tuple] = deque()  # what collect waits for, oldest first
        self.depth = 2 if device.type == "cpu" else 1  # how many may be in flight
        self._jobs: queue.SimpleQueue | None = None  # the device thread's: (work, on_device, future), or None
        self._started = threading.Event()
        self._stream = self._done = None

    def launch(self, work: Callable[[Callable[[], None]], object], on_device: AbstractContextManager,
               keep: object) -> None:
        """Run `work` (the swaps and the forward pass; on CUDA it returns the logits) inside `on_device`, on the
        thread or stream that runs device work; `keep` (its inputs) lives until collect. `work` is given a
        function to call just before its forward pass (see _device_loop)."""
        if len(self._pending) >= self.depth:
            raise RuntimeError(f"launch: {len(self._pending)} forward passes in flight, none collected")
        if self.device.type == "cuda":
            self._pending.append(self._on_stream(work, on_device, keep))
            return
        if self._jobs is None:
            self._start_thread()
        queued = bool(self._pending)  # it starts when the one in flight ends, on the device thread
        self._started.clear()
        future: Future = Future()
        self._pending.append(future)
        self._jobs.put((work, on_device, future))
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

    def _on_stream(self, work: Callable[[Callable[[], None]], Tensor], on_device: AbstractContextManager,
                   keep: object) -> tuple:
        """Queue the work after what the current stream holds (prepare's uploads), then the logits' copy."""
        if self._stream is None:
            self._stream, self._done = torch.cuda.Stream(self.device), torch.cuda.Event()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream), on_device:
            logits = work(lambda: None)
            host = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=True)
            host.copy_(logits, non_blocking=True)
            self._done.record(self._stream)
        return host, logits, keep  # alive until the event: memory the stream still reads or writes

    def _start_thread(self) -> None:
        """The device thread (`_device_loop`), with this thread's torch thread count.

        While it lives the interpreter forces a switch of the GIL after GIL_SWITCH_S instead of 5 ms: a
        small model's forward pass is mostly Python between short ops, and the device thread takes the
        GIL back after each op before a waiting host thread wakes, so the host thread gets it only when
        the interpreter forces a switch.
        """
        self._jobs = queue.SimpleQueue()
        thread = threading.Thread(target=_device_loop, args=(self._jobs, self._started, torch.get_num_threads()),
                                  name="itertrace-device_0", daemon=True)
        thread.start()
        weakref.finalize(self, _stop, self._jobs, thread)
        weakref.finalize(self, sys.setswitchinterval, sys.getswitchinterval())
        sys.setswitchinterval(GIL_SWITCH_S)


def _device_loop(jobs: queue.SimpleQueue, started: threading.Event, threads: int) -> None:
    """The device thread: runs the works in order, and makes each one's result known only once the next
    one has reached its forward pass (the function its work calls), or at once if none is queued.

    Why: a host thread woken by a result wants the GIL at once, while the device thread still needs it
    to go on to the next forward pass; the host then holds it for its own work (and may lose its core
    to another process while holding it), and the device waits. Woken once the next pass runs without
    the GIL (TorchScript), the host takes the GIL from no one.
    """
    torch.set_num_threads(threads)  # OpenMP's count is per thread
    done: list[tuple[Future, object, BaseException | None]] = []  # the last work's result, not yet known

    def publish() -> None:
        while done:
            future, result, error = done.pop()
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    while True:
        try:
            job = jobs.get_nowait() if done else jobs.get()
        except queue.Empty:
            publish()
            continue
        if job is None:
            publish()
            return
        work, on_device, future = job
        result, error = None, None
        try:
            with on_device:
                started.set()
                result = work(publish)
        except BaseException as exc:  # noqa: BLE001 - handed to the host thread, which raises it
            error = exc
        publish()  # had its work not called it
        done.append((future, result, error))
        if error is not None:
            publish()


def _stop(jobs: queue.SimpleQueue, thread: threading.Thread) -> None:
    """End the device thread and wait for it: one still running while the interpreter shuts down aborts it."""
    jobs.put(None)
    if thread is not threading.current_thread():  # a collection on the device thread itself
        with deferred():  # see itertrace.interrupts: a join a signal broke into leaves the thread running
            thread.join()
