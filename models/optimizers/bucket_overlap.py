"""Compressed averages of DDP gradient buckets, run on one worker thread while the backward pass goes on.

DDP calls a communication hook for each bucket as soon as the backward pass has filled it. The hook
queues a job for the bucket (fold its gradients into the momenta, one 1-bit allreduce) and returns at
once; one worker thread runs the jobs in the order they were queued, which is the order DDP calls the
hooks, the same on every rank, so the ranks' collectives pair up. The worker communicates in a process
group of its own: DDP may issue collectives of its own from the backward thread meanwhile
(`find_unused_parameters`' usage map), and two threads must never interleave collectives in one gloo
group. DDP waits for every bucket's future at the end of the backward pass, so the optimizer step that
follows finds every bucket's result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

import torch
import torch.distributed as dist

from models.compressed_allreduce import CompressedAllreduce
from models.errors import FilterForwardError

Result = TypeVar("Result")


class BucketOverlap(Generic[Result]):
    """A FIFO worker thread for per-bucket jobs, their results by bucket index, and the compressed
    allreduce (on a process group of its own) the jobs use."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        # Only the group's own ranks take part in creating the new group (they all build this optimizer).
        self.comm = CompressedAllreduce(dist.new_group(ranks, use_local_synchronization=True))
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bucket-overlap")
        self._lock = threading.Lock()
        self._results: dict[int, tuple[int, Result]] = {}
        self._queued: set[tuple[int, int]] = set()  # (step, bucket index) since the last take()

    def submit(
        self, step: int, index: int, job: Callable[[], Result], buffer: torch.Tensor
    ) -> torch.futures.Future[torch.Tensor]:
        """Queue job() for bucket `index` of step `step`; the future resolves to the bucket's (untouched)
        gradients when the job is done, or raises what the job raised. A bucket queued twice for one step (a
        second backward pass before step(), e.g. gradient accumulation outside no_sync()) raises at once: its
        second allreduce would feed the first one's compression error into the average."""
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        with self._lock:
            repeated = (step, index) in self._queued
            self._queued.add((step, index))
        if repeated:
            future.set_exception(
                FilterForwardError(
                    f"bucket {index} was averaged twice before optimizer.step() {step}: run the backward passes of "
                    "the extra micro-batches under ddp_model.no_sync() when accumulating gradients"
                )
            )
            return future

        def run() -> None:
            try:
                result = job()
            except BaseException as error:  # handed to DDP, which raises it from backward()
                future.set_exception(error)
                return
            with self._lock:
                self._results[index] = (step, result)
            future.set_result(buffer)

        self._worker.submit(run)
        return future

    def take(self, step: int) -> list[Result]:
        """The results the hooks produced for step `step`, in bucket order; older ones are dropped."""
        with self._lock:
            results, self._results = self._results, {}
            self._queued.clear()
        return [result for index, (done, result) in sorted(results.items()) if done == step]
