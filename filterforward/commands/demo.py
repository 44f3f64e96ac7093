"""`filterforward demo`: the whole product on one machine in one command.

Generates a synthetic labelled clip (or takes a labelled dataset), trains the default filter (as `filterforward
train` does; or one MC kind) on the first part, runs an edge node over the clip with it, and scores the held-out
rest: event table, event F1 and the bandwidth saved against sending the whole stream.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from filterforward.commands.train import add_arch_option
from models.errors import FilterForwardError
from models.mc_kinds import AUTO

MARKER = ".filterforward-demo"  # in a working folder the demo made: a later run replaces what it wrote there


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="synthetic clip (or your dataset) -> train a filter -> run the edge -> event table, F1, bandwidth",
        description="End to end on one machine: make (or take) a labelled clip, train a filter (the default one, as "
        "`filterforward train` does, unless --arch says otherwise) on its first part, run the edge over the clip, and "
        "report events, event F1 and bandwidth on the held-out rest.",
    )
    parser.add_argument("--dataset", type=Path, help="labelled dataset folder (default: generate a synthetic one)")
    parser.add_argument("--event", help="event to filter for (default: red_in_region for the synthetic clip)")
    add_arch_option(parser)
    parser.add_argument("--train-fraction", type=float, default=0.6, help="leading share of frames to train on")
    parser.add_argument("--frames", type=int, default=900, help="length of the synthetic clip")
    parser.add_argument(
        "--input-size", default=None, help="base-DNN input WxH (default: the clip's size, at most 768x448 pixels)"
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="working folder (default runs/demo)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into an --out that holds other files (its synthetic/, filters/ and edge/ are replaced)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edge.config import CameraConfig, EdgeConfig, SinkConfig
    from edge.node import EdgeNode
    from edge.replay import evaluate
    from filterforward.commands.eval import format_report
    from filterforward.commands.options import check_writable, parse_size
    from filterforward.commands.train import report
    from models.datasets import open_dataset, write_synthetic
    from models.model_selection import CANDIDATES, CandidateEstimate, train_default
    from models.taps import check_input_size, default_input_size
    from models.training import TrainConfig, train_mc

    if not 0.1 <= args.train_fraction <= 0.9:
        raise FilterForwardError(f"--train-fraction {args.train_fraction} must be between 0.1 and 0.9")
    if args.steps < 1:
        raise FilterForwardError(f"--steps must be at least 1, got {args.steps}")
    if args.input_size:  # before minutes of clip rendering
        try:
            check_input_size(parse_size(args.input_size))
        except ValueError as exc:
            raise FilterForwardError(f"--input-size: {exc}") from None
    check_writable(args.out, "--out", folder=True)
    claim_folder(args.out, args.force)
    if args.dataset:
        dataset = open_dataset(args.dataset)
    else:
        print(f"1/4 writing a synthetic labelled clip of {args.frames} frames to {args.out / 'synthetic'}")
        dataset = write_synthetic(args.out / "synthetic", n_frames=args.frames, overwrite=True, progress=True)
    event = args.event or ("red_in_region" if "red_in_region" in dataset.labels else dataset.events()[0])
    dataset.require_event(event)
    input_size = parse_size(args.input_size) if args.input_size else default_input_size(dataset.frame_size)
    split = int(dataset.n_frames * args.train_fraction)

    kind = "the default filter (kind chosen by cross-validation)" if args.arch == AUTO else f"a {args.arch} MC"
    print(f"2/4 training {kind} for {event!r} on frames 0:{split} at input {input_size[0]}x{input_size[1]}")
    config = TrainConfig(
        event=event,
        architecture=CANDIDATES[0][0] if args.arch == AUTO else args.arch,
        input_size=input_size,
        roi=dataset.roi(event),
        frames=(0, split),
        steps=args.steps,
    )
    candidates: list[CandidateEstimate] = []
    if args.arch == AUTO:
        trained, candidates = train_default(dataset, config, args.out / "filters")
    else:
        trained = train_mc(dataset, config, args.out / "filters")
    print(report(trained, candidates, config.frames, config.optimizer, 1, own_threshold=args.arch == AUTO))

    print(f"3/4 running the edge over all {dataset.n_frames} frames of {dataset.source}")
    sink = args.out / "edge"
    shutil.rmtree(sink, ignore_errors=True)  # a fresh events.jsonl for this run's table
    camera = CameraConfig(name="demo", source=str(dataset.source), pacing="every-frame")
    EdgeNode(
        EdgeConfig(input_size=input_size, cameras=[camera], filters=[trained.bundle], sink=SinkConfig(path=sink))
    ).run()
    print(format_events(sink / "events.jsonl", dataset.fps, split))

    print(f"4/4 scoring the held-out frames {split}:{dataset.n_frames}")
    print(format_report(evaluate(dataset, [trained.bundle], (split, dataset.n_frames))))
    print(f"\nfilter bundle: {trained.bundle}\nmatched frames (stream/: H.264 fragments) and events.jsonl: {sink}")
    return 0


def claim_folder(out: Path, force: bool) -> None:
    """The demo replaces its synthetic/, filters/ and edge/ in --out on every run: a folder holding anything but an
    earlier demo's is refused unless --force, so a mistyped --out loses no files."""
    if out.is_dir() and not (out / MARKER).exists() and any(out.iterdir()) and not force:
        raise FilterForwardError(
            f"--out {out} holds files of its own, and the demo replaces what it writes there: give a new or empty "
            "folder, or --force to write into it anyway"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).touch()


def format_events(events_file: Path, fps: float, split: int) -> str:
    """The events the edge reported, one line each, with the part of the clip they lie in (`both`: one that
    began in the training frames and ended in the held-out ones)."""
    rows = [json.loads(line) for line in events_file.read_text().splitlines()]
    ended = [r for r in rows if r["type"] == "event_end"]
    lines = [
        f"{'event':<34} {'frames':>11} {'seconds':>13} {'peak':>5}  part",
    ]
    for r in ended:
        part = "train" if r["end_frame"] < split else "held-out" if r["start_frame"] >= split else "both"
        lines.append(
            f"{r['id']:<34} {r['start_frame']:>5}-{r['end_frame']:<5} {r['start_time']:6.1f}-{r['end_time']:<6.1f} "
            f"{r['peak_score']:5.2f}  {part}"
        )
    return "\n".join(lines) if ended else "no events detected"
