"""`filterforward train`: train one microclassifier on a labelled dataset and write its filter bundle."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from filterforward.commands.options import RANGE_HELP, THREADS_HELP
from models.errors import FilterForwardError
from models.mc_kinds import AUTO, MC_KINDS
from models.optimizer_kinds import OPTIMIZERS
from models.roi import MAX_CONTEXT, parse_region

if TYPE_CHECKING:
    from collections.abc import Sequence

    from models.datasets import LabelledDataset
    from models.model_selection import CandidateEstimate
    from models.roi import ROI
    from models.training import TrainConfig, TrainResult


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a microclassifier for one event of a labelled dataset",
        description="Train one MC (or one per --event) from cached base-DNN features (computed once per dataset, "
        "tap and ROI) and write a filter bundle (spec.json + model.onnx) that the edge and the cloud accept. "
        "Cross-validation over time on the training frames (whole occurrences of the event held out) chooses the "
        "MC kind (--arch auto), the threshold and k-of-n, and estimates the event F1 to expect on new footage; "
        "that estimate and its warnings go into spec.json. Keep later frames for `filterforward eval`.",
    )
    parser.add_argument("dataset", type=Path, help="dataset folder (labels.csv + video or images)")
    parser.add_argument(
        "--event",
        action="append",
        help="label column to learn (default: the dataset's only event); repeat to train one MC per event, "
        "each written to OUT/<filter name> (<event>-<kind>), reusing the cached base-DNN features of the same tap "
        "and ROI",
    )
    add_arch_option(parser)
    parser.add_argument(
        "--tap",
        help=f"base-DNN tap of an explicit --arch (default: {_default_taps()})",
    )
    parser.add_argument(
        "--roi",
        help="the event's region in 0..1 coordinates: a box x0,y0,x1,y1 or a polygon 'x,y x,y x,y ...' (the MC reads "
        "the box around it and only the cells inside it); default: the event's region in dataset.yaml, else the full "
        "frame",
    )
    parser.add_argument(
        "--context",
        help=f"cells of the tap around the region that the MC reads but never counts, 0-{MAX_CONTEXT}: a full_frame "
        "MC then counts an object only where its response peaks inside the region, against its neighbours that far "
        "(the default filter reads 1 at 384x224, 2 at 768x448, more at larger input sizes, or this if it is more; an "
        "explicit --arch reads none unless given)",
    )
    parser.add_argument(
        "--input-size", help="base-DNN input WxH, multiples of 32 (default: the frame size, at most 768x448 px)"
    )
    parser.add_argument(
        "--scales",
        help="also train on the frames at these multiples of the input size, e.g. 0.75,1.25 (one more base-DNN pass "
        "each; full_frame and the default filter; the filter still runs at --input-size; default: none)",
    )
    parser.add_argument(
        "--mirror",
        action="store_true",
        help="also train on the frames mirrored left to right (one more base-DNN pass; full_frame and the default "
        "filter)",
    )
    parser.add_argument(
        "--frames", default=None, help=f"training frames START:STOP (default: the first half); {RANGE_HELP}"
    )
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size, half positives (default 32)")
    parser.add_argument(
        "--lr",
        type=float,
        default=1e-3,
        help=f"learning rate (default 1e-3{_lr_scales()})",
    )
    parser.add_argument(
        "--optimizer",
        default="adam",
        help=f"{_optimizers()} (default adam)",
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
    parser.add_argument("--window", type=int, help="frames a windowed MC stacks (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    parser.add_argument("--name", help="filter name (default: EVENT-ARCH)")
    parser.add_argument("--base-model", type=Path, help="base ONNX model with named taps (default: EfficientNet-Lite0)")
    parser.add_argument(
        "--out", type=Path, required=True, help="bundle folder to write (with several --event: their parent)"
    )
    parser.add_argument("--force", action="store_true", help="replace a filter bundle already in --out")
    parser.set_defaults(func=_train)


def add_arch_option(parser: argparse.ArgumentParser) -> None:
    """--arch, as `train` and `demo` take it."""
    parser.add_argument(
        "--arch",
        choices=(AUTO, *MC_KINDS),
        default=AUTO,
        help="MC architecture; auto (the default filter) cross-validates the full-frame MC on the mid and the late "
        "tap and keeps the better one",
    )


def _default_taps() -> str:
    """'late for full_frame, mid for localized/windowed, ...': each kind's default tap."""
    kinds: dict[str, list[str]] = {}
    for kind in MC_KINDS.values():
        kinds.setdefault(kind.default_tap, []).append(kind.name)
    return ", ".join(f"{tap} for {'/'.join(names)}" for tap, names in kinds.items())


def _lr_scales() -> str:
    """'; onebit_lamb uses 10x this' for each optimizer that scales the learning rate."""
    return "".join(f"; {kind.name} uses {kind.lr_scale:g}x this" for kind in OPTIMIZERS.values() if kind.lr_scale != 1)


def _optimizers() -> str:
    """'adam, or a communication-compressed one: onebit_adam, ...'."""
    plain = ", ".join(name for name, kind in OPTIMIZERS.items() if not kind.compressed)
    compressed = ", ".join(name for name, kind in OPTIMIZERS.items() if kind.compressed)
    return f"{plain}, or a communication-compressed one: {compressed}"


def _train(args: argparse.Namespace) -> int:
    from filterforward.commands.options import check_writable
    from models.datasets.labelled import open_dataset
    from models.distributed_training import check_nproc

    check_writable(args.out, "--out", folder=True)
    check_nproc(args.nproc)  # before any work: it was checked only once cross-validation had run
    dataset = open_dataset(args.dataset)
    events = _events(args.event, dataset)
    if len(events) > 1 and args.name:
        raise FilterForwardError("--name names one filter: drop it when training several --event at once")
    configs = {event: _config(args, dataset, event) for event in events}  # each checked before any is trained
    # several events: each bundle's folder is named like the filter inside it (the kind `auto` trains, not "auto")
    outs = {event: args.out if len(events) == 1 else args.out / _filter_name(configs[event]) for event in events}
    if len(set(outs.values())) < len(outs):
        raise FilterForwardError(
            f"events {', '.join(events)} give filters of the same name: train them one --event at a time, with --name"
        )
    if not args.force:  # every one before the first is trained: minutes of work, then a refusal, is worse
        for out in outs.values():
            check_no_bundle(out)
    for event, out in outs.items():
        _train_one(args, dataset, configs[event], out)
    return 0


def _filter_name(config: TrainConfig) -> str:
    from models.training import default_name

    return default_name(config.event, config.architecture)


def check_no_bundle(out: Path) -> None:
    """Refuse to replace a filter bundle unless asked to (--force), as the dataset commands refuse a dataset."""
    from models.bundle import MODEL_FILE, SPEC_FILE

    if existing := [name for name in (SPEC_FILE, MODEL_FILE) if (out / name).exists()]:
        raise FilterForwardError(
            f"{out} already holds a filter bundle ({', '.join(existing)}): give another --out or replace it (--force)"
        )


def _config(args: argparse.Namespace, dataset: LabelledDataset, event: str) -> TrainConfig:
    """The event's training settings from the options, checked against the dataset (its labels included)."""
    from filterforward.commands.options import parse_range, parse_scales, parse_size
    from models.model_selection import CANDIDATES, checked_candidates
    from models.taps import default_input_size
    from models.training import TrainConfig, check_config, parse_curriculum

    if args.arch == AUTO and args.tap:
        raise FilterForwardError("--tap goes with an explicit --arch: auto chooses the tap itself")
    frames = parse_range(args.frames, dataset.n_frames) if args.frames else (0, max(1, dataset.n_frames // 2))
    config = TrainConfig(
        event=event,
        architecture=CANDIDATES[0][0] if args.arch == AUTO else args.arch,
        input_size=parse_size(args.input_size) if args.input_size else default_input_size(dataset.frame_size),
        tap=args.tap,
        roi=_region(args, dataset, event),
        frames=frames,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        window=TrainConfig.window if args.window is None else args.window,
        optimizer=args.optimizer,
        curricula=tuple(parse_curriculum(text) for text in args.curriculum),
        name=args.name,
        threads=args.threads,
        scales=parse_scales(args.scales) if args.scales else (),
        mirror=args.mirror,
    )
    if args.window is not None and not config.kind.windowed:  # it was kept in the spec, and did nothing
        raise FilterForwardError(
            f"--window is the frames a windowed MC stacks; {config.architecture} reads one frame: drop --window or "
            "give --arch windowed"
        )
    if args.arch == AUTO:
        checked_candidates(dataset, config)
    else:
        check_config(dataset, config)
    return config


def _train_one(args: argparse.Namespace, dataset: LabelledDataset, config: TrainConfig, out: Path) -> None:
    """Train and summarise one MC (MCs after the first on the same tap and ROI reuse the cached features)."""
    from models.model_selection import choose_kind, train_default
    from models.training import train_mc

    frames = config.frames
    candidates = []
    if args.arch == AUTO and args.nproc == 1:
        result, candidates = train_default(dataset, config, out, args.base_model)
    elif args.nproc == 1:
        result = train_mc(dataset, config, out, args.base_model)
    else:
        from models.distributed_training import launch

        if args.arch == AUTO:  # the kind is chosen on one process, then trained (and validated) on N
            choice = choose_kind(dataset, config, args.base_model)
            # The ranks train one model together: no ensemble (its members would be trained one by one).
            config, candidates = dataclasses.replace(choice.config, ensemble=1), choice.candidates
        result = launch(dataset, config, out, args.nproc, args.base_model)
    own_threshold = args.arch == AUTO and args.nproc == 1  # the default filter (models.crossval.FINAL_THRESHOLD)
    print(report(result, candidates, frames, config.optimizer, args.nproc, own_threshold))


def _region(args: argparse.Namespace, dataset: LabelledDataset, event: str) -> ROI:
    roi = parse_region(args.roi) if args.roi is not None else dataset.roi(event)  # '' is refused, not ignored
    if args.context is None:
        return roi
    if not args.context.isdigit() or int(args.context) > MAX_CONTEXT:
        raise FilterForwardError(f"--context {args.context!r} is not a number of cells: give 0 to {MAX_CONTEXT}")
    return roi.with_context(int(args.context))


def report(
    result: TrainResult,
    candidates: Sequence[CandidateEstimate],
    frames: tuple[int, int],
    optimizer: str,
    nproc: int,
    own_threshold: bool = False,
) -> str:
    """Each cross-validated candidate's estimate (the default filter's), then the summary of what was trained."""
    lines = []
    for candidate in candidates:
        estimate = candidate.validation
        f1 = f"{estimate.event_f1:.3f} ({estimate.f1_min:.3f}-{estimate.f1_max:.3f})" if estimate else "not measurable"
        lines.append(f"candidate {candidate.architecture} on tap {candidate.tap}: held-out event F1 {f1}")
    return "\n".join([*lines, summary(result, frames, optimizer, nproc, own_threshold)])


def summary(
    result: TrainResult, frames: tuple[int, int], optimizer: str, nproc: int, own_threshold: bool = False
) -> str:
    """What was trained, how it is expected to do on new footage, and what to label next."""
    spec, scores = result.spec, result.train_scores
    lines = [
        f"filter {spec.name}: {spec.architecture} on tap {spec.tap}, region {spec.roi.describe()}, "
        f"at {spec.input_size[0]}x{spec.input_size[1]}",
        f"trained on frames {frames[0]}:{frames[1]} ({result.n_positive} positive, {result.n_negative} negative), "
        f"{len(result.losses)} steps with {optimizer} on {nproc} process(es), final loss {result.losses[-1]:.4f}",
    ]
    validation = spec.validation
    if validation is not None:
        held = "whole occurrences" if validation.method == "occurrences" else "thirds of the occurrences' frames"
        lines.append(
            f"expected on new footage (cross-validation, {validation.folds} folds, {held} held out): event F1 "
            f"{validation.event_f1:.3f} (folds {validation.f1_min:.3f}-{validation.f1_max:.3f}), precision "
            f"{validation.precision:.3f}, event recall {validation.event_recall:.3f}"
        )
    smoothing = spec.smoothing
    chosen = f"chosen on the {'training' if validation is None else 'held-out'} frames"
    if own_threshold:
        chosen = f"k-of-n {chosen}; the threshold is the model's own"
    lines.append(f"threshold {smoothing.threshold:.3g} (k={smoothing.k} of n={smoothing.n}): {chosen}")
    if spec.motion is not None:
        lines.append(
            f"motion veto: a frame counts only if {spec.motion.min_foreground:.2%} of the region's pixels moved in "
            f"its last {spec.motion.frames} frames (as on nearly every training frame with the event)"
        )
    elif result.no_veto:
        lines.append(f"motion veto: none, {result.no_veto}")
    lines.append(
        f"on its own training frames: event F1 {scores.f1:.3f} (precision {scores.precision:.3f}, event recall "
        f"{scores.event_recall:.3f}, {scores.n_detected}/{scores.n_events} events)"
    )
    lines += [f"warning: {text}" for text in spec.caveats]
    lines.append(f"bundle: {result.bundle}")
    return "\n".join(lines)


def _events(chosen: list[str] | None, dataset: LabelledDataset) -> list[str]:
    events = dataset.events()
    if chosen:
        for event in chosen:  # before any is trained: a typo in the last --event must not come after the others' work
            dataset.require_event(event)
        return list(dict.fromkeys(chosen))  # in order, each once
    if len(events) == 1:
        return events
    raise FilterForwardError(f"the dataset has several events ({', '.join(events)}): choose one with --event")
