"""Train one MC on N processes: the torchrun worker (`python -m models.distributed_training JOB`) and its launcher.

`launch` writes the job (dataset, TrainConfig, bundle folder, base model) as JSON and runs
``python -m torch.distributed.run --standalone --nproc-per-node N -m models.distributed_training JOB``
(gloo on CPU, NCCL with one GPU per rank when CUDA is there). Each worker:

* rank 0 fills the feature cache (it has one writer at a time), then the others read it;
* builds the same seeded MC, trains it on its own balanced batches (seed + rank): with `adam` (any optimizer
  not `compressed` in models.optimizer_kinds) the MC is wrapped in DDP (gradient averaging), the compressed
  optimizers communicate themselves;
* makes the parameters identical (0/1 Adam's local steps may end between synchronisations: then the
  ranks' parameters are averaged once, in full precision);
* rank 0 picks the threshold and writes the same bundle as single-process training, and the result
  summary the launcher returns. A FilterForwardError on any rank comes back as its one-line message.

What the user sees of the workers is rank 0's stderr (progress, warnings); torchrun's own output and the other
ranks' go to files in the job folder, and every traceback too. When the workers fail, those files are kept as one
log (`filterforward-train-*.log` in the temporary folder) that the one-line error names; `-v` also prints it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from models.curriculum import CurriculumScheduler
from models.datasets.labelled import LabelledDataset, open_dataset
from models.errors import FilterForwardError
from models.evaluation import EventScores
from models.filterspec import FilterSpec, Smoothing
from models.memory import check_memory
from models.microclassifiers import MicroClassifier
from models.optimizer_kinds import OPTIMIZERS
from models.roi import ROI
from models.stopping import check_stop, stop_requested
from models.training import (
    BalancedSampler,
    Curriculum,
    Logits,
    TrainConfig,
    TrainingData,
    TrainResult,
    check_config,
    cross_validate,
    finish_training,
    load_training_data,
    make_optimizer,
    new_model,
    torch_threads,
    train_steps,
)

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
RESULT_FILE = "result.json"
ERROR_FILE = "error.txt"
TORCHRUN_LOG = "torchrun.log"  # torchrun's own stdout and stderr (and what a worker writes before main runs)
CONSOLE_ENV = "FILTERFORWARD_CONSOLE"  # the terminal rank 0 writes to, when the launcher's stderr is one
TAIL_PERIOD = 0.2  # seconds between reads of rank 0's stderr file when there is no terminal
STOP_POLL = 0.5  # seconds between looks for a stop request (models.stopping) while torchrun runs


def rank_stderr(job_dir: Path, rank: int) -> Path:
    """A rank's stderr (rank 0's too when there is no terminal to write to)."""
    return job_dir / f"rank{rank}.err"


def rank_failure(job_dir: Path, rank: int) -> Path:
    """A rank's unexpected exception: its first line, then its traceback."""
    return job_dir / f"rank{rank}.failure"


@dataclass(frozen=True)
class TrainingJob:
    """Everything a worker needs, as the launcher hands it over."""

    dataset: Path
    config: TrainConfig
    out_dir: Path
    model_path: Path | None = None
    progress: bool = True


def launch(
    dataset: LabelledDataset,
    config: TrainConfig,
    out_dir: Path,
    nproc: int,
    model_path: Path | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train with `nproc` torchrun workers on this machine; rank 0's result."""
    check_config(dataset, config)  # one-line errors before any process starts
    check_nproc(nproc)
    check_memory(dataset, [config], copies=nproc)  # every rank holds the training crops
    job = TrainingJob(dataset.root.resolve(), config, out_dir.resolve(), model_path and model_path.resolve(), progress)
    with tempfile.TemporaryDirectory(prefix="ff-train-") as job_dir:
        (Path(job_dir) / JOB_FILE).write_text(json.dumps(job_to_dict(job)))
        returncode = _run_torchrun(Path(job_dir), nproc)
        return _outcome(Path(job_dir), nproc, returncode)


def _run_torchrun(job_dir: Path, nproc: int) -> int:
    """Run the workers, torchrun's output into a file and rank 0's stderr to ours; torchrun's exit code."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    command += ["-m", __name__, str(job_dir)]
    # Loopback only: --standalone is one machine, and hostname lookups fail in some sandboxes.
    env = {"GLOO_SOCKET_IFNAME": "lo", **os.environ}
    console = _terminal()
    if console:
        env[CONSOLE_ENV] = console  # rank 0 writes there itself, so that its progress bars stay on
    stop = threading.Event()
    tail = None if console else threading.Thread(target=_tail, args=(rank_stderr(job_dir, 0), stop), daemon=True)
    with (job_dir / TORCHRUN_LOG).open("wb") as output:
        if tail:
            tail.start()
        try:
            with subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT) as torchrun:
                return _wait_unless_stopped(torchrun)
        finally:
            stop.set()
            if tail:
                tail.join()


def _wait_unless_stopped(torchrun: subprocess.Popen) -> int:
    """torchrun's exit code; a stop request (models.stopping) ends it, and torchrun its workers."""
    while True:
        try:
            return torchrun.wait(STOP_POLL)
        except subprocess.TimeoutExpired:
            if stop_requested():
                torchrun.terminate()
                torchrun.wait()
                check_stop()


def _terminal() -> str | None:
    """The terminal our stderr is, if it is one."""
    try:
        return os.ttyname(sys.stderr.fileno()) if sys.stderr.isatty() else None
    except (OSError, ValueError, AttributeError):  # a closed or replaced sys.stderr
        return None


def _tail(path: Path, stop: threading.Event) -> None:
    """Copy what rank 0 writes to `path` to our stderr as it comes, until `stop` is set and all of it is copied."""
    offset = 0
    while True:
        stopping = stop.is_set()
        if path.exists():
            with path.open("rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            if chunk:
                offset += len(chunk)
                sys.stderr.write(chunk.decode(errors="replace"))
                sys.stderr.flush()
        if stopping:
            return
        time.sleep(TAIL_PERIOD)


def _outcome(job_dir: Path, nproc: int, returncode: int) -> TrainResult:
    """Rank 0's result; a worker's one-line error (its FilterForwardError's, else the first unexpected exception's),
    with where the workers' full log was kept."""
    error, result = job_dir / ERROR_FILE, job_dir / RESULT_FILE
    if returncode == 0 and result.exists():
        return result_from_dict(json.loads(result.read_text()))
    full_log = _keep_log(job_dir, nproc)
    if error.exists():
        raise FilterForwardError(f"{error.read_text().strip()} (workers' log: {full_log})")
    if not result.exists():
        raise FilterForwardError(f"{_what_failed(job_dir, nproc, returncode)}: see the workers' log {full_log}")
    # Rank 0 writes the result after the bundle, from parameters every rank shares: it is complete.
    # Seen once while measuring: a gloo rank aborted ("terminate called") as the group shut down.
    log.warning(
        "a training worker failed after rank 0 wrote the bundle (torchrun exit code %d): see %s", returncode, full_log
    )
    return result_from_dict(json.loads(result.read_text()))


def _what_failed(job_dir: Path, nproc: int, returncode: int) -> str:
    """The first rank's unexpected exception, in one line; torchrun's exit code when no rank recorded one (killed:
    the OOM killer, a signal)."""
    failures = sorted(job_dir.glob("rank*.failure"), key=lambda path: path.stat().st_mtime_ns)
    if not failures:
        return f"the {nproc} training workers failed (torchrun exit code {returncode}, no exception recorded)"
    first = failures[0]
    rank = first.stem.removeprefix("rank")
    return f"training worker rank {rank} of {nproc} failed: {first.read_text().splitlines()[0]}"


def _keep_log(job_dir: Path, nproc: int) -> Path:
    """torchrun's output and every rank's stderr and traceback in one file that outlives the job folder; with -v
    (debug logging) it is also printed."""
    parts = [job_dir / TORCHRUN_LOG]
    for rank in range(nproc):
        parts += [rank_stderr(job_dir, rank), rank_failure(job_dir, rank)]
    text = "".join(f"==> {path.name} <==\n{path.read_text(errors='replace')}\n" for path in parts if path.exists())
    handle, name = tempfile.mkstemp(prefix="filterforward-train-", suffix=".log")
    with os.fdopen(handle, "w") as file:
        file.write(text)
    if log.isEnabledFor(logging.DEBUG):
        sys.stderr.write(text)
    return Path(name)


def check_nproc(nproc: int) -> None:
    """At least one worker; with CUDA, at most one per GPU (NCCL cannot share a GPU between ranks)."""
    if nproc < 1:
        raise FilterForwardError(f"--nproc must be at least 1, got {nproc}")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise FilterForwardError(
            f"--nproc {nproc} is more than the {torch.cuda.device_count()} GPUs here: NCCL needs one GPU per worker"
        )


@dataclass(frozen=True)
class WorkerOutcome:
    """What one rank ends with."""

    model: MicroClassifier  # the trained MC, identical on every rank
    losses: list[float]  # this rank's loss per step (its own batches)
    averaged: bool  # the ranks' parameters differed after the last step and were averaged once
    result: TrainResult | None  # rank 0 only: the bundle it wrote and its summary


def train_distributed(job: TrainingJob) -> WorkerOutcome:
    """The worker's training in an initialised process group (torchrun's, or any other): every rank takes part
    in each cross-validation fold and in the final training, so the folds see the same optimizer as the filter."""
    rank = dist.get_rank()
    config = dataclasses.replace(job.config, device=_device(job.config.device))
    dataset = open_dataset(job.dataset)
    data = _load_rank0_first(dataset, config, job.model_path, job.progress and rank == 0)
    progress = job.progress and rank == 0
    validation = cross_validate(data, config, lambda fold: _fit_on_ranks(config, fold, progress)[:2])
    model, losses, averaged = _fit_on_ranks(config, data, progress)
    result = None
    if rank == 0:
        result = finish_training(model, data, config, job.out_dir, job.model_path, losses, validation)
    return WorkerOutcome(model, losses, averaged, result)


def _fit_on_ranks(config: TrainConfig, data: TrainingData, progress: bool) -> tuple[MicroClassifier, list[float], bool]:
    """One MC trained by every rank on its own batches and made identical across ranks; whether that took an
    average of the ranks' parameters."""
    rank = dist.get_rank()
    model = new_model(config, data)
    _broadcast_parameters(model)  # identical seeds make them equal already; this makes it a guarantee
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr, config.steps, config.curricula)
    net = Logits(model)
    if not OPTIMIZERS.lookup(config.optimizer).compressed:  # DDP averages the gradients
        net = DistributedDataParallel(net, device_ids=[config.device] if config.device.startswith("cuda") else None)
    sampler = BalancedSampler(data.frames, data.targets, config.batch_size, config.seed + rank)
    with torch_threads(config.threads):
        losses = train_steps(net, data, optimizer, sampler, config, progress)
    averaged = synchronise_parameters(model)
    if averaged:
        log.info("ranks ended between synchronisations: their parameters were averaged once")
    return model, losses, averaged


def synchronise_parameters(model: MicroClassifier) -> bool:
    """Make every rank's parameters equal; True when they differed and were averaged, False when already equal."""
    flat = parameters_to_vector(model.parameters()).detach()
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    differs = torch.tensor([float(not torch.equal(flat, reference))], device=flat.device)
    dist.all_reduce(differs, op=dist.ReduceOp.MAX)
    if not differs.item():
        return False
    dist.all_reduce(flat)
    vector_to_parameters(flat / dist.get_world_size(), model.parameters())
    return True


def _broadcast_parameters(model: MicroClassifier) -> None:
    flat = parameters_to_vector(model.parameters()).detach()
    dist.broadcast(flat, src=0)
    vector_to_parameters(flat, model.parameters())


def _device(configured: str) -> str:
    """One GPU per rank under NCCL (LOCAL_RANK), else the configured device."""
    if dist.get_backend() == "nccl":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return configured


def _load_rank0_first(
    dataset: LabelledDataset, config: TrainConfig, model_path: Path | None, progress: bool
) -> TrainingData:
    """Rank 0 fills the feature cache, then every other rank reads it; a failure on rank 0 fails every rank."""
    rank = dist.get_rank()
    data, error = None, None
    if rank == 0:
        try:
            data = load_training_data(dataset, config, model_path, progress)
        except FilterForwardError as exc:
            error = str(exc)
    message = [error]
    dist.broadcast_object_list(message, src=0)  # doubles as the barrier
    if message[0] is not None:
        raise FilterForwardError(message[0])
    return data if data is not None else load_training_data(dataset, config, model_path, progress=False)


def job_to_dict(job: TrainingJob) -> dict[str, Any]:
    config = {field.name: getattr(job.config, field.name) for field in dataclasses.fields(job.config)}
    config["roi"] = job.config.roi.model_dump()
    config["smoothing"] = job.config.smoothing.model_dump()
    config["curricula"] = [{"kind": c.kind, "schedule": c.scheduler.config.model_dump()} for c in job.config.curricula]
    return {
        "dataset": str(job.dataset),
        "config": config,
        "out_dir": str(job.out_dir),
        "model_path": job.model_path and str(job.model_path),
        "progress": job.progress,
    }


def job_from_dict(data: dict[str, Any]) -> TrainingJob:
    config = dict(data["config"])
    config["input_size"] = tuple(config["input_size"])
    config["frames"] = config["frames"] and tuple(config["frames"])
    config["roi"] = ROI(**config["roi"])
    config["smoothing"] = Smoothing(**config["smoothing"])
    config["curricula"] = tuple(
        Curriculum(c["kind"], CurriculumScheduler(**c["schedule"])) for c in config["curricula"]
    )
    model_path = data["model_path"]
    return TrainingJob(
        Path(data["dataset"]),
        TrainConfig(**config),
        Path(data["out_dir"]),
        model_path and Path(model_path),
        data["progress"],
    )


def result_to_dict(result: TrainResult) -> dict[str, Any]:
    return {
        "spec": result.spec.model_dump(mode="json"),
        "bundle": str(result.bundle),
        "train_scores": dataclasses.asdict(result.train_scores),
        "losses": result.losses,
        "n_positive": result.n_positive,
        "n_negative": result.n_negative,
    }


def result_from_dict(data: dict[str, Any]) -> TrainResult:
    return TrainResult(
        FilterSpec.model_validate(data["spec"]),
        Path(data["bundle"]),
        EventScores(**data["train_scores"]),
        data["losses"],
        data["n_positive"],
        data["n_negative"],
    )


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point: join the group from torchrun's environment, train, leave rank 0's result."""
    (job_dir,) = argv if argv is not None else sys.argv[1:]
    job_path = Path(job_dir)
    rank = int(os.environ.get("RANK", 0))
    _redirect_stderr(job_path, rank)
    logging.basicConfig(level=logging.WARNING, format=f"rank {rank}: %(message)s")
    try:
        return _work(job_path, rank)
    except Exception as exc:  # joining the group failed
        _record_failure(job_path, rank, exc)
        return 1


def _work(job_path: Path, rank: int) -> int:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    try:
        result = train_distributed(job_from_dict(json.loads((job_path / JOB_FILE).read_text()))).result
        if result is not None:
            (job_path / RESULT_FILE).write_text(json.dumps(result_to_dict(result)))
        dist.barrier()
    except FilterForwardError as exc:
        (job_path / ERROR_FILE).write_text(f"{exc}\n")  # every rank fails with the same message
        return 1
    except Exception as exc:
        # Recorded before the group goes: the other ranks fail only once it has, so the first failure is the cause.
        _record_failure(job_path, rank, exc)
        return 1
    finally:
        dist.destroy_process_group()
    return 0


def _record_failure(job_path: Path, rank: int, exc: Exception) -> None:
    """An unexpected exception: its one line for the launcher, its traceback for the log (not for the user)."""
    first_line = f"{type(exc).__name__}: {exc}".splitlines()[0]
    rank_failure(job_path, rank).write_text(f"{first_line}\n{traceback.format_exc()}")


def _redirect_stderr(job_path: Path, rank: int) -> None:
    """Rank 0 writes to the launcher's terminal (CONSOLE_ENV) or to the file the launcher copies to its stderr; the
    other ranks, whose warnings repeat rank 0's, to their own files for the log. At the file descriptor, so that
    what torch and gloo write in C++ goes there too."""
    console = os.environ.get(CONSOLE_ENV) if rank == 0 else None
    try:
        target = os.open(console, os.O_WRONLY | os.O_NOCTTY) if console else None
    except OSError:  # no longer ours to open: the file, which nobody copies then, still keeps it for the log
        target = None
    if target is None:
        target = os.open(rank_stderr(job_path, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(target, sys.stderr.fileno())
    os.close(target)


if __name__ == "__main__":
    sys.exit(main())
