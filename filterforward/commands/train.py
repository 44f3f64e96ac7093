"""`filterforward train`: train one microclassifier on a labelled dataset and write its filter bundle."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from pydantic import ValidationError

from models.errors import FilterForwardError
from models.filterspec import Architecture
from models.roi import ROI

if TYPE_CHECKING:
    from models.datasets import LabelledDataset


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a microclassifier for one event of a labelled dataset",
        description="Train one MC (or one per --event) from cached base-DNN features (computed once per dataset, "
        "tap and ROI) and write a filter bundle (spec.json + model.onnx) that the edge and the cloud accept. "
        "The threshold is chosen on the training frames; keep the other frames for `filterforward eval`.",
    )
    parser.add_argument("dataset", type=Path, help="dataset folder (labels.csv + video or images)")
    parser.add_argument(
        "--event",
        action="append",
        help="label column to learn (default: the dataset's only event); repeat to train one MC per event, "
        "each written to OUT/<event>-<arch>, reusing the cached base-DNN features of the same tap and ROI",
    )
    parser.add_argument(
        "--arch", choices=get_args(Architecture), default="localized", help="MC architecture (default localized)"
    )
    parser.add_argument(
        "--tap", help="base-DNN tap (default: late for full_frame, mid for localized/windowed, pixels for discrete)"
    )
    parser.add_argument(
        "--roi", help="x0,y0,x1,y1 in 0..1 (default: the event's region in dataset.yaml, else the full frame)"
    )
    parser.add_argument("--input-size", help="base-DNN input WxH, multiples of 32 (default: the frame size rounded)")
    parser.add_argument("--frames", default=None, help="training frames START:STOP (default: the first half)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size, half positives (default 32)")
    parser.add_argument(
        "--lr",
        type=float,
        default=1e-3,
        help="learning rate (default 1e-3; onebit_lamb uses 10x this: its step is relative to each tensor's size)",
    )
    parser.add_argument(
        "--optimizer",
        default="adam",
        help="adam, or a communication-compressed one: onebit_adam, zeroone_adam, onebit_lamb (default adam)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="training processes on this machine, launched with torchrun (gloo on CPU, NCCL with one GPU each); "
        "each trains on its own batches, so the global batch is N x --batch-size (default 1: no torchrun)",
    )
    parser.add_argument(
        "--curriculum",
        action="append",
        default=[],
        metavar="KIND:SCHEDULE:...",
        help="grow an input difficulty during training (repeatable, one per KIND): KIND window (frames of a windowed "
        "MC's window shown) or resolution (percent of the crop's cells per side); SCHEDULE fixed_linear:MIN:MAX:"
        "TOTAL_STEPS[:DIFFICULTY_STEP], fixed_root:MIN:MAX:TOTAL_STEPS:ROOT_DEGREE[:DIFFICULTY_STEP] or "
        "fixed_discrete:D1,D2,..:LAST_STEP1,.. ; e.g. window:fixed_linear:2:5:100",
    )
    parser.add_argument("--window", type=int, default=5, help="frames a windowed MC stacks (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: MCs are tiny)")
    parser.add_argument("--name", help="filter name (default: EVENT-ARCH)")
    parser.add_argument("--base-model", type=Path, help="base ONNX model with named taps (default: EfficientNet-Lite0)")
    parser.add_argument(
        "--out", type=Path, required=True, help="bundle folder to write (with several --event: their parent)"
    )
    parser.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from models.datasets.labelled import open_dataset

    dataset = open_dataset(args.dataset)
    events = _events(args.event, dataset.events())
    if len(events) > 1 and args.name:
        raise FilterForwardError("--name names one filter: drop it when training several --event at once")
    for event in events:
        out = args.out if len(events) == 1 else args.out / f"{event}-{args.arch}"
        _train_one(args, dataset, event, out)
    return 0


def _train_one(args: argparse.Namespace, dataset: LabelledDataset, event: str, out: Path) -> None:
    """Train and summarise one MC (MCs after the first on the same tap and ROI reuse the cached features)."""
    from filterforward.commands.options import parse_range, parse_size
    from models.taps import round_input_size
    from models.training import TrainConfig, parse_curriculum, train_mc

    frames = parse_range(args.frames, dataset.n_frames) if args.frames else (0, max(1, dataset.n_frames // 2))
    config = TrainConfig(
        event=event,
        architecture=args.arch,
        input_size=parse_size(args.input_size) if args.input_size else round_input_size(dataset.frame_size),
        tap=args.tap,
        roi=_parse_roi(args.roi) if args.roi else dataset.roi(event),
        frames=frames,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        window=args.window,
        optimizer=args.optimizer,
        curricula=tuple(parse_curriculum(text) for text in args.curriculum),
        name=args.name,
        threads=args.threads,
    )
    if args.nproc == 1:
        result = train_mc(dataset, config, out, args.base_model)
    else:
        from models.distributed_training import launch

        result = launch(dataset, config, out, args.nproc, args.base_model)
    spec, scores = result.spec, result.train_scores
    roi = spec.roi
    print(
        f"filter {spec.name}: {spec.architecture} on tap {spec.tap}, ROI {roi.x0:g},{roi.y0:g},{roi.x1:g},{roi.y1:g} "
        f"at {spec.input_size[0]}x{spec.input_size[1]}"
    )
    print(
        f"trained on frames {frames[0]}:{frames[1]} ({result.n_positive} positive, {result.n_negative} negative), "
        f"{len(result.losses)} steps with {config.optimizer} on {args.nproc} process(es), final loss "
        f"{result.losses[-1]:.4f}"
    )
    print(
        f"threshold {spec.smoothing.threshold:g} (k={spec.smoothing.k} of n={spec.smoothing.n}): train event F1 "
        f"{scores.f1:.3f} (precision {scores.precision:.3f}, event recall {scores.event_recall:.3f}, "
        f"{scores.n_detected}/{scores.n_events} events)"
    )
    print(f"bundle: {result.bundle}")


def _events(chosen: list[str] | None, events: list[str]) -> list[str]:
    if chosen:
        return list(dict.fromkeys(chosen))  # in order, each once
    if len(events) == 1:
        return events
    raise FilterForwardError(f"the dataset has several events ({', '.join(events)}): choose one with --event")


def _parse_roi(text: str) -> ROI:
    try:
        x0, y0, x1, y1 = (float(part) for part in text.split(","))
        return ROI(x0=x0, y0=y0, x1=x1, y1=y1)
    except ValueError as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else "not four numbers"
        raise FilterForwardError(
            f"ROI {text!r} is not valid ({reason}): give x0,y0,x1,y1 in 0..1, e.g. 0.5,0,1,1"
        ) from None
