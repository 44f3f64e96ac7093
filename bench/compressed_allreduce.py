"""Benchmark: the 1-bit compressed allreduce and the compressed optimizers against fp32, on loopback and 100 Mbit/s.

Two measurements, each in groups of real gloo processes (one process per rank) on two links:

* allreduce: `CompressedAllreduce.allreduce` against `dist.all_reduce` (fp32) on tensors of 1M, 10M and
  100M elements at 2, 3 and 4 ranks: bytes each rank sends and seconds per call;
* model: the step time of a communication-heavy MLP (25M parameters) under DDP with Adam (fp32 gradient
  allreduce) and with OnebitAdam, ZeroOneAdam and OnebitLamb in their compression stage.

Links: `loopback` (127.0.0.1) and `slow`: every rank in its own network namespace, joined to a bridge by
a veth pair rate-limited to 100 Mbit/s in each direction with `tc tbf` (needs root and iproute2; the
namespaces are created for the run and deleted after it, also on error). In each group the cases run
side by side in a rotating order, so load from other processes lands on all of them alike.

    python bench/compressed_allreduce.py            # the default run (about 7 minutes on 2 cores)
    python bench/compressed_allreduce.py --quick    # a smoke run (under a minute)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

from models.errors import FilterForwardError

log = logging.getLogger("bench.compressed_allreduce")

REPO = Path(__file__).resolve().parents[1]
# onebit_adam_overlap: 1-bit Adam with its overlap hook (a 1-bit allreduce per DDP bucket during backward).
OPTIMIZERS = ("adam", "onebit_adam", "onebit_adam_overlap", "zeroone_adam", "onebit_lamb")
TARGETS = {"step_speedup": 3.0, "bytes_ratio": 1 / 20}
LINKS = ("loopback", "slow")
# The emulated thin link: tbf on both ends of every rank's veth, so upload and download are each 100 Mbit/s.
RATE = "100mbit"
TBF = ("rate", RATE, "burst", "64kb", "latency", "100ms")
NETNS_PREFIX = "ffbench-"
SUBNET = "10.77.0"  # only ever assigned inside the namespaces this benchmark creates
SLOW_PORT = 29500  # the namespaces are fresh, so any port is free there
# Sizes at or above this many elements run with one timed call and no warm-up (a call takes tens of
# seconds on the slow link) and only at the --big-worlds world sizes (memory, see BYTES_PER_ELEMENT).
BIG = 50_000_000
# Peak resident bytes per element of one rank timing both allreduces (measured: 2.85 GB for 100M elements
# without the fp32 scratch buffer): the compressed call's padded copy, error buffers and temporaries.
BYTES_PER_ELEMENT = 34
# Peak resident bytes per parameter of one rank in the model group: four models side by side, each with
# parameters, gradients, DDP buckets and two moments (4 bytes each), plus the compressed call's temporaries.
BYTES_PER_PARAMETER = 4 * 4 * 5 + BYTES_PER_ELEMENT
MEMORY_SHARE = 0.8  # of MemAvailable a run may plan to use
WARMUP_STEPS = 2  # untimed: step 1 is the fp32 warm-up of the compressed optimizers, step 2 their first 1-bit step


@dataclass(frozen=True)
class Settings:
    """What to run, from the command line."""

    sizes: tuple[int, ...]
    worlds: tuple[int, ...]
    big_worlds: tuple[int, ...]
    model_world: int
    model_dims: tuple[int, ...]
    batch: int
    model_steps: int
    repeats: int
    warmup: int
    links: tuple[str, ...]
    timeout: float
    out: Path


@dataclass(frozen=True)
class Link:
    """How the ranks of a group reach each other: addresses, interface, and the command prefix of rank r."""

    name: str
    ifname: str
    description: str

    def address(self, rank: int) -> str:
        return "127.0.0.1" if self.name == "loopback" else f"{SUBNET}.{rank + 1}"

    def prefix(self, rank: int) -> list[str]:
        return [] if self.name == "loopback" else ["ip", "netns", "exec", f"{NETNS_PREFIX}r{rank}"]


LOOPBACK = Link("loopback", "lo", "loopback (127.0.0.1), no rate limit")
SLOW = Link(
    "slow",
    "eth0",
    f"{RATE}/s: one network namespace per rank, veth to a bridge namespace, tc tbf {' '.join(TBF)} "
    "on both ends (each rank: 100 Mbit/s up and 100 Mbit/s down)",
)


# ---------------------------------------------------------------------------------------------------------
# The slow link: network namespaces, veth pairs, tbf


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _delete_namespaces() -> None:
    """Delete every namespace this benchmark creates (also leftovers of a killed run); their veths go with them."""
    listing = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(NETNS_PREFIX):
            _ip("netns", "delete", name)


def _build_namespaces(ranks: int) -> None:
    hub = f"{NETNS_PREFIX}hub"
    _ip("netns", "add", hub)
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "link", "set", "br0", "up")
    for rank in range(ranks):
        ns, port = f"{NETNS_PREFIX}r{rank}", f"p{rank}"
        _ip("netns", "add", ns)
        _ip("link", "add", SLOW.ifname, "netns", ns, "type", "veth", "peer", "name", port, "netns", hub)
        _ip("-n", hub, "link", "set", port, "master", "br0")
        _ip("-n", hub, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", f"{SLOW.address(rank)}/24", "dev", SLOW.ifname)
        _ip("-n", ns, "link", "set", SLOW.ifname, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        # Egress of the rank's end limits its upload, egress of the bridge port its download.
        _ip("netns", "exec", ns, "tc", "qdisc", "add", "dev", SLOW.ifname, "root", "tbf", *TBF)
        _ip("netns", "exec", hub, "tc", "qdisc", "add", "dev", port, "root", "tbf", *TBF)


def check_slow_link_tools() -> None:
    """Fail before any timing when the slow link cannot be built here."""
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        raise FilterForwardError(
            "the 100 Mbit/s link needs root and iproute2 (ip netns, veth, tc tbf): run as root or pass --links loopback"
        )


@contextlib.contextmanager
def slow_link(ranks: int) -> Iterator[Link]:
    """Namespaces for `ranks` ranks on a 100 Mbit/s link for the duration of the block; always removed after."""
    _delete_namespaces()
    try:
        try:
            _build_namespaces(ranks)
        except subprocess.CalledProcessError as exc:
            raise FilterForwardError(
                f"could not build the emulated link ({' '.join(exc.cmd)}: {exc.stderr.strip()}): "
                "check that network namespaces, veth, bridge and tc tbf work here, or pass --links loopback"
            ) from None
        yield SLOW
    finally:
        _delete_namespaces()


@contextlib.contextmanager
def open_link(name: str, ranks: int) -> Iterator[Link]:
    if name == "loopback":
        yield LOOPBACK
    else:
        with slow_link(ranks) as link:
            yield link


# ---------------------------------------------------------------------------------------------------------
# Worker side (one process per rank, started with --worker)


def tx_bytes(ifname: str) -> int | None:
    """Bytes this network namespace's interface has sent; None on loopback, which every process shares."""
    if ifname == "lo":
        return None
    for line in Path("/proc/self/net/dev").read_text().splitlines()[2:]:
        name, counters = line.split(":", 1)
        if name.strip() == ifname:
            return int(counters.split()[8])
    raise RuntimeError(f"no interface {ifname} in /proc/self/net/dev")


def timed(fn: Callable[[], object], ifname: str) -> tuple[float, int | None]:
    """Seconds and interface bytes of fn on this rank, fenced by barriers so it covers the slowest rank."""
    import torch.distributed as dist

    dist.barrier()
    sent, started = tx_bytes(ifname), time.perf_counter()
    fn()
    dist.barrier()
    seconds, after = time.perf_counter() - started, tx_bytes(ifname)
    return seconds, None if sent is None else after - sent


def rotate(cases: dict[str, Callable[[], object]], warmup: int, repeats: int, ifname: str) -> dict[str, list]:
    """Warm every case up, then time each `repeats` times in a rotating order: {case: [(seconds, tx bytes)]}."""
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    samples: dict[str, list] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            samples[name].append(timed(cases[name], ifname))
    return samples


def ring_bytes(elements: int, world: int) -> int:
    """Bytes a rank sends in a ring allreduce of fp32 elements: 2·(n−1)/n of the tensor."""
    return 2 * (world - 1) * 4 * elements // world


def summarise_samples(samples: list) -> dict:
    seconds = [s for s, _ in samples]
    sent = [b for _, b in samples if b is not None]
    return {
        "seconds": statistics.median(seconds),
        "samples": seconds,
        "tx_bytes": statistics.median(sent) if sent else None,
    }


def allreduce_rows(plan: dict, rank: int) -> list[dict]:
    """Per tensor size: the compressed and the fp32 allreduce, timed side by side."""
    import torch
    import torch.distributed as dist

    from models.compressed_allreduce import CompressedAllreduce

    world, rows = plan["world"], []
    for size in plan["sizes"]:
        tensor = torch.randn(size, generator=torch.Generator().manual_seed(rank))
        # all_reduce sums in place, so the values grow by x world per call; big (even inf) floats add as fast.
        scratch = tensor.clone()
        comm = CompressedAllreduce()
        cases = {
            "compressed": lambda t=tensor, c=comm: c.allreduce(t, "bench"),
            "fp32": lambda s=scratch: dist.all_reduce(s),
        }
        big = size >= BIG
        samples = rotate(cases, 0 if big else plan["warmup"], 1 if big else plan["repeats"], plan["ifname"])
        calls = (0 if big else plan["warmup"]) + (1 if big else plan["repeats"])
        rows.append(
            {
                "elements": size,
                "world": world,
                "compressed": {**summarise_samples(samples["compressed"]), "bytes": comm.bytes_on_wire // calls},
                "fp32": {**summarise_samples(samples["fp32"]), "bytes": ring_bytes(size, world)},
            }
        )
        del tensor, scratch, comm, cases
        if rank == 0:
            log.info("%d elements done", size)
    return rows


# Tiny on purpose: the run only times steps, and after a 1-step warm-up the frozen variance is so rough that
# 1-bit Adam at lr 1e-4 diverges on this MLP within four compressed steps (then steps are skipped as non-finite).
MODEL_LR = 1e-6


def build_optimizer(name: str, params: list, lr: float = MODEL_LR):
    """The optimizer `name`, set up to enter its compression stage at step 2 (step 1 is its fp32 warm-up)."""
    import torch

    from models.optimizers import OnebitAdam, OnebitLamb, ZeroOneAdam

    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name in ("onebit_adam", "onebit_adam_overlap"):
        return OnebitAdam(params, lr=lr, freeze_step=1)
    if name == "zeroone_adam":
        # The default local_step_scaler keeps the synchronisation interval at 1 for a long time: the costly case.
        return ZeroOneAdam(params, lr=lr, var_freeze_step=1, var_update_scaler=1)
    return OnebitLamb(params, lr=lr, freeze_step=1)


def model_rows(plan: dict, rank: int) -> list[dict]:
    """Step time of the MLP under DDP with each optimizer, the optimizers' steps interleaved."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dims, batch, world = plan["model_dims"], plan["batch"], plan["world"]
    runs = {}
    for name in OPTIMIZERS:
        torch.manual_seed(0)  # identical parameters everywhere, so DDP need not broadcast them over the slow link
        layers = [layer for i, o in pairwise(dims) for layer in (nn.Linear(i, o), nn.ReLU())]
        ddp = DistributedDataParallel(nn.Sequential(*layers[:-1]), init_sync=False)
        optimizer = build_optimizer(name, list(ddp.parameters()))
        if name == "onebit_adam_overlap":
            ddp.register_comm_hook(None, optimizer.ddp_overlap_hook)
        elif name != "adam":
            ddp.register_comm_hook(None, optimizer.ddp_comm_hook)
        runs[name] = (ddp, optimizer)
    parameters = sum(p.numel() for p in runs["adam"][0].parameters())
    data = torch.Generator().manual_seed(1000 + rank)
    inputs, targets = torch.randn(batch, dims[0], generator=data), torch.randn(batch, dims[-1], generator=data)

    losses: dict[str, float] = {}

    def step(name: str) -> None:
        ddp, optimizer = runs[name]
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        losses[name] = loss.item()

    cases = {name: (lambda n=name: step(n)) for name in OPTIMIZERS}
    rotate(cases, WARMUP_STEPS, 0, plan["ifname"])
    sent_before = {name: getattr(opt, "bytes_on_wire", 0) for name, (_, opt) in runs.items()}
    samples = rotate(cases, 0, plan["model_steps"], plan["ifname"])
    rows, steps = [], WARMUP_STEPS + plan["model_steps"]
    for name, (_, optimizer) in runs.items():
        counted = (getattr(optimizer, "bytes_on_wire", 0) - sent_before[name]) // plan["model_steps"]
        rows.append(
            {
                "optimizer": name,
                "world": world,
                "parameters": parameters,
                **summarise_samples(samples[name]),
                "bytes": ring_bytes(parameters, world) if name == "adam" else counted,
                "last_loss": losses[name],
                # Steps skipped as non-finite (torch's Adam has no step_count and never skips).
                "skipped": steps - getattr(optimizer, "step_count", steps),
            }
        )
    dist.barrier()
    return rows


def worker(plan_path: Path, rank: int) -> None:
    """One rank: join the group, run the plan, and (rank 0) write the rows."""
    import torch
    import torch.distributed as dist

    plan = json.loads(plan_path.read_text())
    torch.set_num_threads(plan["threads"])
    os.environ["GLOO_SOCKET_IFNAME"] = plan["ifname"]
    dist.init_process_group(
        "gloo", init_method=f"tcp://{plan['master']}:{plan['port']}", rank=rank, world_size=plan["world"]
    )
    try:
        result = {"allreduce": allreduce_rows(plan, rank), "model": model_rows(plan, rank) if plan["model"] else []}
        if rank == 0:
            Path(plan["result"]).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------
# Orchestration


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_parameters(dims: Sequence[int]) -> int:
    return sum(i * o + o for i, o in pairwise(dims))


def sizes_for(settings: Settings, world: int) -> list[int]:
    return [s for s in settings.sizes if s < BIG or world in settings.big_worlds]


def check_memory(settings: Settings) -> None:
    """Refuse a plan whose largest group would not fit in the memory available now."""
    available = next(
        int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines() if "MemAvailable" in line
    )
    need = max(
        world
        * max(
            max(sizes_for(settings, world), default=0) * BYTES_PER_ELEMENT,
            model_parameters(settings.model_dims) * BYTES_PER_PARAMETER if world == settings.model_world else 0,
        )
        for world in settings.worlds
    )
    if need > MEMORY_SHARE * available:
        raise FilterForwardError(
            f"the largest group needs about {need / 2**30:.1f} GiB but {available / 2**30:.1f} GiB is available: "
            "lower --sizes, --big-worlds or --model-world"
        )


def launch(plan: dict, link: Link, timeout: float) -> dict:
    """Start one process per rank (inside its namespace on the slow link), wait, and return rank 0's rows."""
    with tempfile.TemporaryDirectory(prefix="ffbench-") as tmp:
        plan = {**plan, "result": str(Path(tmp) / "result.json")}
        plan_path = Path(tmp) / "plan.json"
        plan_path.write_text(json.dumps(plan))
        script = str(Path(__file__).resolve())
        processes = [
            subprocess.Popen([*link.prefix(r), sys.executable, script, "--worker", str(plan_path), "--rank", str(r)])
            for r in range(plan["world"])
        ]
        try:
            wait_all(processes, timeout)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        return json.loads(Path(plan["result"]).read_text())


def wait_all(processes: list[subprocess.Popen], timeout: float) -> None:
    """Wait for every rank; stop at the first failure (the others would wait for it forever) or the timeout."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in processes):
        failed = [p.returncode for p in processes if p.returncode not in (None, 0)]
        if failed:
            raise FilterForwardError(f"a benchmark rank exited with status {failed[0]}: see its traceback above")
        if time.monotonic() > deadline:
            raise FilterForwardError(f"a benchmark group ran past {timeout:.0f} s: raise --timeout or lower --sizes")
        time.sleep(0.2)
    failed = [p.returncode for p in processes if p.returncode != 0]
    if failed:
        raise FilterForwardError(f"a benchmark rank exited with status {failed[0]}: see its traceback above")


def run_link(settings: Settings, name: str) -> dict:
    """Every world size on one link: the allreduce rows, and the model rows of the --model-world group."""
    rows: dict = {"allreduce": [], "model": []}
    with open_link(name, max(settings.worlds)) as link:
        for world in settings.worlds:
            log.info("%s link, %d ranks", name, world)
            plan = {
                "world": world,
                "sizes": sizes_for(settings, world),
                "repeats": settings.repeats,
                "warmup": settings.warmup,
                "model": world == settings.model_world,
                "model_dims": list(settings.model_dims),
                "batch": settings.batch,
                "model_steps": settings.model_steps,
                "threads": max(1, (os.cpu_count() or 1) // world),
                "ifname": link.ifname,
                "master": link.address(0),
                "port": free_port() if name == "loopback" else SLOW_PORT,
            }
            result = launch(plan, link, settings.timeout)
            rows["allreduce"] += result["allreduce"]
            rows["model"] += result["model"]
    return {"link": link.description, **rows}


def add_ratios(results: dict[str, dict]) -> None:
    """Bytes ratio and speedup of each allreduce row; step speedup over Adam of each model row."""
    for link in results.values():
        for row in link["allreduce"]:
            row["bytes_ratio"] = row["compressed"]["bytes"] / row["fp32"]["bytes"]
            row["speedup"] = row["fp32"]["seconds"] / row["compressed"]["seconds"]
        adam = {row["world"]: row for row in link["model"] if row["optimizer"] == "adam"}
        for row in link["model"]:
            row["speedup"] = adam[row["world"]]["seconds"] / row["seconds"]
            row["bytes_ratio"] = row["bytes"] / adam[row["world"]]["bytes"]


# ---------------------------------------------------------------------------------------------------------
# Report


def megabytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.2f}"


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def print_report(results: dict[str, dict], settings: Settings) -> None:
    import torch

    print(
        f"\nCompressed allreduce benchmark, torch {torch.__version__} (gloo), {os.cpu_count()} CPUs, "
        f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    skipped = [s for s in settings.sizes if s >= BIG]
    if skipped:
        worlds = ",".join(map(str, settings.big_worlds))
        print(
            f"sizes >= {BIG // 1_000_000}M elements: ranks {worlds} only (memory), 1 timed call and no warm-up; "
            f"others: median of {settings.repeats} after {settings.warmup} warm-up"
        )
    for name, link in results.items():
        print(f"\n== link {name}: {link['link']}")
        print_allreduce(link["allreduce"])
        print_model(link["model"], name == "slow")
    print(
        "\nbytes = what one rank sends per call/step (1-bit: the allreduce's own count; fp32: a ring allreduce, "
        "2(n-1)/n x 4 bytes/element); tx = bytes the rank's interface really sent (slow link only, with TCP/IP headers)"
    )
    print(
        f"targets: 1-bit bytes <= 1/{1 / TARGETS['bytes_ratio']:.0f} of fp32; step >= {TARGETS['step_speedup']:.0f}x "
        "faster than Adam in the compression stage on the slow link"
    )


def print_allreduce(rows: list[dict]) -> None:
    print(
        f"{'elements':>11}{'ranks':>6}{'fp32 MB':>10}{'1-bit MB':>10}{'bytes':>8}{'fp32 tx':>10}{'1-bit tx':>10}"
        f"{'fp32 s':>9}{'1-bit s':>9}{'speedup':>9}"
    )
    for row in rows:
        fp32, compressed = row["fp32"], row["compressed"]
        print(
            f"{row['elements']:>11,}{row['world']:>6}{megabytes(fp32['bytes']):>10}{megabytes(compressed['bytes']):>10}"
            f"{'1/' + format(1 / row['bytes_ratio'], '.0f'):>6} {verdict(row['bytes_ratio'] <= TARGETS['bytes_ratio'])}"
            f"{megabytes(fp32['tx_bytes']):>8}{megabytes(compressed['tx_bytes']):>10}"
            f"{fp32['seconds']:>9.3f}{compressed['seconds']:>9.3f}{row['speedup']:>8.2f}x"
        )


def print_model(rows: list[dict], judged: bool) -> None:
    if not rows:
        return
    first = rows[0]
    print(
        f"\nMLP {first['parameters'] / 1e6:.1f}M parameters, {first['world']} ranks, DDP; compressed optimizers in "
        "their compression stage (0/1 Adam: local steps synchronised every step)"
    )
    print(
        f"{'optimizer':<20}{'step s':>9}{'vs adam':>9}{'MB/step':>10}{'bytes':>8}{'tx MB':>9}{'loss':>8}{'skipped':>9}"
    )
    for row in rows:
        target = ""
        if judged and row["optimizer"] != "adam":
            target = " " + verdict(row["speedup"] >= TARGETS["step_speedup"])
        print(
            f"{row['optimizer']:<20}{row['seconds']:>9.3f}{row['speedup']:>8.2f}x{megabytes(row['bytes']):>10}"
            f"{'1/' + format(1 / row['bytes_ratio'], '.0f'):>8}"
            f"{megabytes(row['tx_bytes']):>9}{row['last_loss']:>8.3f}{row['skipped']:>9}{target}"
        )


def write_json(path: Path, results: dict, settings: Settings) -> None:
    import torch

    meta = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()}
    meta.update(
        torch=torch.__version__,
        cpus=os.cpu_count(),
        machine=platform.machine(),
        python=platform.python_version(),
        load_average=os.getloadavg(),
    )
    path.write_text(json.dumps({"settings": meta, "targets": TARGETS, "links": results}, indent=2) + "\n")


def plot(path: Path, results: dict[str, dict]) -> None:
    """Allreduce speedup against tensor size (a line per link and world size); model step times per optimizer."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (sizes, steps) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, link in results.items():
        for world in sorted({row["world"] for row in link["allreduce"]}):
            points = [(r["elements"], r["speedup"]) for r in link["allreduce"] if r["world"] == world]
            style = {"marker": "o", "linestyle": "-" if name == "slow" else "--", "label": f"{name}, {world} ranks"}
            sizes.plot(*zip(*points, strict=True), **style)
    sizes.axhline(1, color="grey", linewidth=1, linestyle=":")
    sizes.set_xscale("log")
    sizes.set_xlabel("elements (fp32)")
    sizes.set_ylabel("fp32 time / 1-bit time")
    sizes.legend(fontsize=8)
    width = 0.8 / max(len(results), 1)
    for i, (name, link) in enumerate(results.items()):
        seconds = {row["optimizer"]: row["seconds"] for row in link["model"]}
        positions = [k + i * width for k in range(len(OPTIMIZERS))]
        steps.bar(positions, [seconds.get(o, 0) for o in OPTIMIZERS], width, label=name)
    steps.set_xticks([k + width * (len(results) - 1) / 2 for k in range(len(OPTIMIZERS))], OPTIMIZERS)
    steps.set_ylabel("seconds per step (MLP, DDP)")
    steps.legend()
    for axes in (sizes, steps):
        axes.grid(True, alpha=0.3)
    figure.suptitle("1-bit compressed allreduce vs fp32")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------------------
# Command line


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(float(part)) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1e6,1e7, got {text!r}")
    return values


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def link_list(text: str) -> tuple[str, ...]:
    links = tuple(text.split(","))
    if not links or set(links) - set(LINKS):
        raise argparse.ArgumentTypeError(f"links must be among {','.join(LINKS)}, got {text!r}")
    return links


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int_list, default=None, help="tensor elements (default 1e6,1e7,1e8)")
    parser.add_argument("--worlds", type=int_list, default=None, help="ranks per group (default 2,3,4)")
    parser.add_argument(
        "--big-worlds", type=int_list, default=(2,), help=f"the only ranks for sizes >= {BIG:.0e} (default 2)"
    )
    parser.add_argument("--model-world", type=positive, default=2, help="ranks of the model group (default 2)")
    parser.add_argument("--batch", type=positive, default=32, help="samples per rank per step (default 32)")
    parser.add_argument("--model-steps", type=positive, default=None, help="timed steps per optimizer (default 3)")
    parser.add_argument("--repeats", type=positive, default=None, help="timed calls per size (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per size first (default 1)")
    parser.add_argument("--links", type=link_list, default=LINKS, help="loopback,slow (default both)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one group may take (default 600)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="folder for the JSON and the plot")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1e5,1e6 elements, 2 ranks, a small MLP")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    quick = args.quick
    return Settings(
        sizes=args.sizes or ((100_000, 1_000_000) if quick else (1_000_000, 10_000_000, 100_000_000)),
        worlds=args.worlds or ((2,) if quick else (2, 3, 4)),
        big_worlds=args.big_worlds,
        model_world=args.model_world,
        # 25.2M parameters, 4 bytes each: a 100 MB fp32 gradient allreduce per step. Quick: 0.5M.
        model_dims=(256, 1024, 256) if quick else (1024, 4096, 4096, 1024),
        batch=args.batch,
        model_steps=args.model_steps or (1 if quick else 3),
        repeats=args.repeats or (1 if quick else 3),
        warmup=args.warmup,
        links=args.links,
        timeout=args.timeout,
        out=args.out,
    )


def run(settings: Settings) -> dict[str, dict]:
    """The whole benchmark: rows per link with their ratios; writes compressed_allreduce.{json,png}."""
    if settings.model_world not in settings.worlds:
        raise FilterForwardError(f"--model-world {settings.model_world} is not among --worlds {settings.worlds}")
    try:
        import matplotlib  # noqa: F401  # fail before minutes of timing, not after
    except ImportError:
        raise FilterForwardError("matplotlib is missing: pip install -e '.[dev]' to draw the plot") from None
    if "slow" in settings.links:
        check_slow_link_tools()
    check_memory(settings)
    settings.out.mkdir(parents=True, exist_ok=True)
    results = {name: run_link(settings, name) for name in settings.links}
    add_ratios(results)
    write_json(settings.out / "compressed_allreduce.json", results, settings)
    plot(settings.out / "compressed_allreduce.png", results)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.rank)
        return 0
    # A SIGTERM must unwind through the `finally` that deletes the namespaces.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings = settings_of(args)
    try:
        results = run(settings)
    except FilterForwardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_report(results, settings)
    print(f"\nwrote {settings.out / 'compressed_allreduce.json'} and {settings.out / 'compressed_allreduce.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
