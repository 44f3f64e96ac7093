"""`filterforward eval`: replay a labelled dataset through the edge pipeline and report the paper's metrics."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from common.files import write_atomically
from filterforward.commands.options import RANGE_HELP
from models.evaluation import BOUNDARY_TOLERANCE
from models.mc_kinds import MCWeights

if TYPE_CHECKING:
    from edge.replay import ReplayReport
    from models.datasets import LabelledDataset


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="replay a labelled dataset through the edge with trained filters; report event F1 and bandwidth",
        description="Runs the real edge pipeline (every-frame pacing) over a labelled dataset and scores each "
        "filter by event F1 (per-frame precision; event recall = 0.9 x existence + 0.1 x overlap; uncertain "
        "frames ignored) and the bandwidth of what it sent (each filter's encoding: by default the camera's H.264 "
        "stream of matched frames) against the whole stream as H.264 at the same CRF and resolution.",
    )
    parser.add_argument("dataset", type=Path, help="labelled dataset folder (labels.csv + video)")
    parser.add_argument(
        "--filter",
        dest="filters",
        type=Path,
        action="append",
        required=True,
        help="filter bundle folder (repeat for several)",
    )
    parser.add_argument(
        "--frames", default=":", help=f"frame range START:STOP to evaluate (default: all); {RANGE_HELP}"
    )
    parser.add_argument("--event", help="label column to score against (default: the event in each filter's spec)")
    parser.add_argument(
        "--tolerance",
        type=int,
        default=BOUNDARY_TOLERANCE,
        help=f"frames ignored around label boundaries (default {BOUNDARY_TOLERANCE})",
    )
    parser.add_argument(
        "--crf", type=int, default=23, help="H.264 quality of the sent stream, the clips and the whole stream"
    )
    parser.add_argument("--base-model", type=Path, help="ONNX base model (default: EfficientNet-Lite0)")
    parser.add_argument(
        "--mc-weights",
        choices=get_args(MCWeights),
        default="fp32",
        help="the MCs' FC layers as an edge with this `mc_weights` runs them (default fp32)",
    )
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edge.replay import evaluate
    from filterforward.commands.options import check_writable, parse_range
    from models.datasets import open_dataset

    if args.json:
        check_writable(args.json, "--json", folder=False)
    dataset = open_dataset(args.dataset)
    if args.json:
        check_not_read(args.json, dataset, args.filters)
    frames = parse_range(args.frames, dataset.n_frames)
    report = evaluate(
        dataset, args.filters, frames, args.tolerance, args.crf, args.event, args.base_model, weights=args.mc_weights
    )
    print(format_report(report))
    if args.json:  # into folders made if missing (check_writable allowed them), whole or not at all
        write_atomically(args.json, json.dumps(report.as_dict(), indent=2).encode())
    return 0


def check_not_read(report: Path, dataset: LabelledDataset, bundles: list[Path]) -> None:
    """Refuse a report path that is a file this evaluation reads: `--json b1/spec.json` wrote the report over the
    filter's spec, and `--json clip/labels.csv` would over the labels."""
    from models.bundle import MODEL_FILE, SPEC_FILE
    from models.datasets.labelled import CONFIG_FILE, LABELS_FILE
    from models.errors import FilterForwardError

    read = [dataset.root / LABELS_FILE, dataset.root / CONFIG_FILE, dataset.source]
    read += [bundle / name for bundle in bundles for name in (SPEC_FILE, MODEL_FILE)]
    target = report.resolve()
    for path in read:
        if target.is_relative_to(path.resolve()):  # the file itself, or inside an image folder
            raise FilterForwardError(
                f"--json {report} is {path}, which this evaluation reads: write the report elsewhere"
            )


def format_report(report: ReplayReport) -> str:
    width = max(len("filter"), *(len(f.name) for f in report.filters))
    lines = [
        f"dataset {report.dataset}, frames {report.frames[0]}:{report.frames[1]}, "
        f"boundary tolerance ±{report.tolerance} frames, MC weights {report.mc_weights}",
        f"{'filter':<{width}} {'event':<22} {'F1':>6} {'prec':>6} {'recall':>6} {'exist':>6} {'overlap':>7} "
        f"{'events':>6} {'sent':>6}",
    ]
    for f in report.filters:
        s = f.scores
        lines.append(
            f"{f.name:<{width}} {f.event:<22} {s.f1:6.3f} {s.precision:6.3f} {s.event_recall:6.3f} {s.existence:6.3f} "
            f"{s.overlap:7.3f} {f.events:6d} {f.matched_frames:6d}"
        )
    lines.append("events = the events the filter reported, sent = the frames it sent")
    frames = f"{report.frames[0]}:{report.frames[1]}"
    for f in report.filters:
        if f.trained_frames is not None:
            first, stop = f.trained_frames
            lines.append(
                f"note: frames {first}:{stop} of those evaluated are among {f.name}'s training frames: its scores "
                "there are better than on new footage; evaluate on frames after its training range"
            )
        if f.scores.n_events == 0:  # an event F1 over no labelled occurrence is 1.0 when nothing is sent
            lines.append(
                f"note: frames {frames} hold no occurrence of {f.event!r}: {f.name}'s scores only say whether it "
                "sent anything; evaluate on frames with the event"
            )
    whole = report.stream_bps
    n = report.frames[1] - report.frames[0]
    lines += [
        f"change gate: {report.skipped} of {n} frames unchanged, the base DNN ran on {n - report.skipped}",
        "bandwidth (bit/s over the whole replayed duration):",
        f"  whole stream, H.264 crf {report.crf}: {whole:12,.0f}",
        f"  sent (the filters' encodings):  {report.upload_bps:12,.0f}   ({_ratio(whole, report.upload_bps)})",
        f"  matched frames as JPEG q80:     {report.jpeg_bps:12,.0f}   ({_ratio(whole, report.jpeg_bps)})",
        f"  matched frames as H.264 clips:  {report.clip_bps:12,.0f}   ({_ratio(whole, report.clip_bps)})",
    ]
    return "\n".join(lines)


def _ratio(whole: float, part: float) -> str:
    if part <= 0:
        return "nothing sent"
    return f"{whole / part:.1f}x less" if part <= whole else f"{part / whole:.1f}x more"
