"""Test helper: run a function in N real gloo processes on loopback and collect what each rank returns.

Usage from a test module (tests/ is on sys.path under pytest):

    from distributed import run_workers

    def _body(rank: int, world_size: int, scale: float) -> float:   # module level: spawn pickles it by name
        ...                                                          # the gloo group is already initialised
        return value

    results = run_workers(_body, 3, 2.0)   # [value of rank 0, value of rank 1, value of rank 2]
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Each worker gets one intra-op thread: several ranks share few cores, and oversubscription only slows them.
_THREADS_PER_WORKER = 1


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, fn: Callable[..., Any], world_size: int, port: int, out_dir: str, args: tuple) -> None:
    """Join the gloo group, run fn, and leave its result in a file (queues of tensors need the sender alive)."""
    torch.set_num_threads(_THREADS_PER_WORKER)
    # Pinning gloo to loopback avoids hostname lookups, which fail in some sandboxes.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_workers(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120) -> list[Any]:
    """Run fn(rank, world_size, *args) in world_size spawned processes joined in one gloo group.

    Returns the per-rank return values (rank order). A failing worker raises
    torch.multiprocessing.ProcessRaisedException, whose message carries that worker's traceback;
    a run longer than timeout seconds terminates the workers and raises TimeoutError.
    """
    with tempfile.TemporaryDirectory(prefix="ff-dist-") as out_dir:
        context = mp.start_processes(
            _worker,
            args=(fn, world_size, free_port(), out_dir, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        _join(context, timeout)
        return [torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def _join(context: mp.ProcessContext, timeout: float) -> None:
    """Wait for every worker; re-raise the first failure, kill all on timeout."""
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            raise TimeoutError(f"distributed workers did not finish within {timeout} s")
