"""`filterforward dataset`: make synthetic scenes, convert MOTChallenge sequences, describe labelled datasets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from filterforward.commands.options import check_writable, parse_size
from models.errors import FilterForwardError

if TYPE_CHECKING:
    from models.datasets import LabelledDataset, Polygon
    from models.datasets.mot import EdgeCrossing


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dataset",
        help="make, convert and inspect labelled datasets (video or images + labels.csv)",
        description="A labelled dataset is a folder with the frames (one video or an image folder), labels.csv "
        "(frame_index, then one 0/1/-1 column per event) and an optional dataset.yaml. See docs/datasets.md.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    synth = actions.add_parser(
        "synth",
        help="render a synthetic labelled scene (coloured shapes crossing a textured view)",
        description="Writes video.mp4 (H.264), labels.csv and dataset.yaml. Events: red_in_region (a red "
        "object's centre inside region R), blue_present, any_object. The same seed gives the same clip.",
    )
    synth.add_argument("--out", type=Path, required=True, help="folder to write into (created if missing)")
    synth.add_argument("--frames", type=int, default=600, help="number of frames (default 600)")
    synth.add_argument("--size", default="320x192", help="WIDTHxHEIGHT, even numbers (default 320x192)")
    synth.add_argument("--fps", type=float, default=15.0, help="frame rate (default 15)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.add_argument("--force", action="store_true", help="overwrite a dataset already in --out")
    synth.set_defaults(func=run_synth)

    info = actions.add_parser(
        "info",
        help="show a dataset's frames, frame rate, size and per-event label counts",
        description="Opens a labelled dataset folder (or a MOTChallenge sequence, labelled person_present over "
        "the full frame) and prints, per event, its positive/negative/uncertain frames and separate events.",
    )
    info.add_argument("path", type=Path, help="dataset folder")
    info.set_defaults(func=run_info)

    mot = actions.add_parser(
        "mot",
        help="label a MOTChallenge sequence by 'a person's bottom-centre inside POLYGON' events",
        description="Reads seqinfo.ini, gt/gt.txt and the frames (img1/ or one video) of a MOTChallenge "
        "sequence and writes labels.csv + dataset.yaml into --out; the frames are referenced, not copied. "
        "A frame is uncertain (-1) when only boxes MOT ignores (flag 0, distractor classes) are in the polygon.",
    )
    mot.add_argument("path", type=Path, help="MOT sequence folder (with seqinfo.ini and gt/gt.txt)")
    mot.add_argument(
        "--event",
        dest="events",
        action="append",
        default=[],
        metavar="NAME=POLYGON",
        help="event and its polygon in normalised coordinates, e.g. 'left=0,0 0.5,0 0.5,1 0,1' "
        "(repeatable; default person_present over the full frame)",
    )
    mot.add_argument(
        "--edge-frames",
        type=int,
        default=0,
        metavar="N",
        help="label the N frames before a person walks in across the picture's edge (and after one walks out) "
        "uncertain for the events whose region holds their feet: MOT boxes start only once a person is nearly "
        "whole in view (default 0: labelled without them)",
    )
    mot.add_argument("--out", type=Path, required=True, help="folder to write labels.csv and dataset.yaml into")
    mot.add_argument("--force", action="store_true", help="overwrite labels.csv/dataset.yaml already in --out")
    mot.set_defaults(func=run_mot)


def parse_event(text: str) -> tuple[str, Polygon]:
    """'NAME=x,y x,y x,y' -> (NAME, polygon)."""
    from models.datasets import Polygon
    from models.datasets.labelled import check_event_name

    name, sep, polygon = text.partition("=")
    if not sep:
        raise FilterForwardError(f"--event {text!r} lacks '=': write NAME=POLYGON, e.g. 'left=0,0 0.5,0 0.5,1 0,1'")
    return check_event_name(name.strip()), Polygon.parse(polygon)


def run_synth(args: argparse.Namespace) -> int:
    from models.datasets import write_synthetic

    check_writable(args.out, "--out", folder=True)
    dataset = write_synthetic(
        args.out,
        n_frames=args.frames,
        size=parse_size(args.size),
        fps=args.fps,
        seed=args.seed,
        overwrite=args.force,
        progress=True,
    )
    print(f"wrote {args.out}")
    print(describe(dataset))
    return 0


def run_info(args: argparse.Namespace) -> int:
    from models.datasets import mot_dataset, open_dataset
    from models.datasets.labelled import LABELS_FILE

    is_mot = not (args.path / LABELS_FILE).is_file() and (args.path / "seqinfo.ini").is_file()
    print(describe(mot_dataset(args.path) if is_mot else open_dataset(args.path)))
    return 0


def run_mot(args: argparse.Namespace) -> int:
    from models.datasets import edge_crossings, export_mot

    check_writable(args.out, "--out", folder=True)
    events = dict(parse_event(text) for text in args.events)
    if len(events) != len(args.events):
        raise FilterForwardError("an event name is given twice: give each --event its own NAME")
    dataset = export_mot(args.path, args.out, events or None, overwrite=args.force, edge_frames=args.edge_frames)
    print(f"wrote {args.out}")
    print(describe(dataset))
    for event, crossings in edge_crossings(args.path, events or None).items():
        if crossings:
            print(edge_note(event, crossings, args.edge_frames, dataset.fps))
    return 0


def edge_note(event: str, crossings: list[EdgeCrossing], edge_frames: int, fps: float) -> str:
    """What the labels of `event` do with the people who cross the picture's edge inside its region."""
    frames = ", ".join(f"{c.frame}{' in' if c.entering else ' out'}" for c in crossings[:8])
    more = f" and {len(crossings) - 8} more" if len(crossings) > 8 else ""
    done = (
        f"the {edge_frames} frames before (after) each are uncertain"
        if edge_frames
        else f"the frames before (after) each are labelled without them; --edge-frames {max(1, round(fps / 3))} "
        "marks a third of a second of them uncertain"
    )
    return (
        f"note: {event}: {len(crossings)} people walk in or out across the picture's edge with their feet in the "
        f"region (frames {frames}{more}); MOT boxes start only once a person is nearly whole in view, so {done}"
    )


def describe(dataset: LabelledDataset) -> str:
    """A human-readable summary: source, geometry, and a table of label counts per event."""
    width, height = dataset.frame_size
    lines = [
        f"dataset   {dataset.name}",
        f"source    {dataset.source}",
        f"frames    {dataset.n_frames} ({dataset.n_frames / dataset.fps:.1f} s at {dataset.fps:g} fps)",
        f"size      {width}x{height}",
        "",
        f"{'event':<24}{'positive':>10}{'negative':>10}{'uncertain':>11}{'occurrences':>13}  region",
    ]
    for event, values in dataset.labels.items():
        positive, negative, uncertain = (int((values == v).sum()) for v in (1, 0, -1))
        region = dataset.roi(event).describe()
        occurrences = len(dataset.intervals(event))
        lines.append(f"{event:<24}{positive:>10}{negative:>10}{uncertain:>11}{occurrences:>13}  {region}")
    return "\n".join(lines)
