"""Benchmark: does one round of the studio's feedback fix a default filter on footage neither round trained on?

The generalization benchmark (bench/generalization.py) scores a filter trained once on a prefix. In the product a
person then reviews what the filter sent and marks what it missed (the web page's "Wrong"/"Right" and "missed",
docs/studio.md), and a new revision trains on those labels too. This simulates that round with the benchmark's
own split, cut once more: the test part is split at `feedback_stop` (fixed in this file from the label counts
alone, before any filter was scored) into a feedback window and a final part, each holding occurrences that
training never saw.

- Round 0: the default filter trained on the prefix, exactly as bench/generalization.py trains it.
- Feedback: round 0 replayed through the edge pipeline over the feedback window. With `--marks events` (the
  default: the gallery's "Right"/"Wrong" buttons) every event it reported is judged as a whole: all the frames it
  sent for that event are labelled 1 if any of them shows the event, else 0. With `--marks frames` (a person who
  picks frame by frame) every frame it sent gets its own true label. Either way every positive frame of the window
  is labelled 1 (the occurrences it missed, labelled frame by frame on footage requested from the camera: the
  cloud keeps only the frames filters sent). The window's other frames stay unlabelled, as they would in the
  studio.
- Round 1: the default filter trained again on the prefix and those labels.
- Both rounds are replayed over the final part, which neither saw, and scored like `filterforward eval`.

Only clips whose test part holds occurrences on both sides of a cut are used.

    python bench/feedback.py --seeds 0-4 --json bench/out/feedback-events.json           # marked per event
    python bench/feedback.py --seeds 0-4 --marks frames --json bench/out/feedback-frames.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from generalization import (
    CLIPS,
    REPO,
    Clip,
    choices,
    input_size,
    matched_mask,
    open_clip,
    score_summary,
    seed_range,
)

from edge.replay import replay
from models.bundle import load_bundle
from models.datasets import LabelledDataset
from models.datasets.labelled import UNCERTAIN
from models.errors import FilterForwardError
from models.evaluation import BOUNDARY_TOLERANCE, event_f1

log = logging.getLogger("bench.feedback")

# Fixed before any filter was scored. Test occurrences (bench/generalization.py) in feedback window | final part:
#   adl near_camera 364-387 | 416-466, 485-516
#   adl left_quarter 364-383 | 445-476, 485-505
# The car clip (one test occurrence per event that starts in the test part) and tud (one) have no such cut.
FEEDBACK_STOP = {"adl-rundle-6": 400}


@dataclass
class Row:
    event: str
    size: tuple[int, int]
    round: int  # 0: trained on the prefix; 1: and on the feedback window's labels
    seeds: list[int] = field(default_factory=list)
    f1: list[float] = field(default_factory=list)
    precision: list[float] = field(default_factory=list)
    event_recall: list[float] = field(default_factory=list)
    labelled: list[int] = field(default_factory=list)  # feedback frames labelled (round 1)
    train_seconds: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {
            **score_summary(self.f1, self.precision, self.event_recall),
            "labelled": statistics.fmean(self.labelled) if self.labelled else 0.0,
            "train_s": statistics.fmean(self.train_seconds),
        }


MARKS = ("events", "frames")  # how a person marks what the filter sent: each event as a whole, or frame by frame


@dataclass(frozen=True)
class Sent:
    """What one filter sent over a replay: its frames, and the frames of each event it reported."""

    frames: set[int]
    events: list[set[int]]


def feedback_labels(truth: np.ndarray, sent: Sent, window: tuple[int, int], marks: str) -> np.ndarray:
    """The labels a person gives in the window (see the module docstring), the rest uncertain; the training prefix
    keeps its labels. `truth` covers the whole clip."""
    labels = np.full(len(truth), UNCERTAIN, dtype=truth.dtype)
    labels[: window[0]] = truth[: window[0]]
    start, stop = window
    inside = [index for index in sent.frames if start <= index < stop]
    labels[inside] = truth[inside]
    if marks == "events":
        for frames in sent.events:
            marked = [index for index in frames if start <= index < stop]
            labels[marked] = int((truth[marked] == 1).any())
    positive = np.flatnonzero(truth[start:stop] == 1) + start
    labels[positive] = 1
    return labels


def train(dataset: LabelledDataset, event: str, size: tuple[int, int], stop: int, seed: int, out: Path) -> float:
    """The default filter trained on frames 0..stop-1 (their uncertain frames left out); seconds it took."""
    from models.model_selection import train_default
    from models.training import TrainConfig

    config = TrainConfig(
        event=event,
        architecture="full_frame",
        input_size=size,
        roi=dataset.roi(event),
        frames=(0, stop),
        seed=seed,
        name=f"{event}-{out.name}".replace("_", "-"),
    )
    started = time.perf_counter()
    train_default(dataset, config, out, progress=False)
    return time.perf_counter() - started


def sent_frames(dataset: LabelledDataset, bundles: list[Path], frames: tuple[int, int]) -> dict[Path, Sent]:
    """What each filter sent when all of them are replayed together over `frames` (base DNN on every frame)."""
    sink = replay(dataset, bundles, frames, progress=False, gate=None)
    sent = {}
    for path in bundles:
        name = load_bundle(path)[0].name
        matched = set(sink.frames.get(name, ()))
        events = [e for e in sink.events if e.filter == name and e.end_frame is not None]
        spans = [{i for i in matched if e.start_frame <= i <= e.end_frame} for e in events]
        sent[path] = Sent(matched, spans)
    return sent


def score_clip(
    dataset: LabelledDataset, clip: Clip, size: tuple[int, int], seeds: Sequence[int], marks: str
) -> list[Row]:
    feedback_stop = FEEDBACK_STOP[clip.folder]
    window, final = (clip.train_stop, feedback_stop), (feedback_stop, dataset.n_frames)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ff-feedback-") as folder:
        out = Path(folder)
        for event in clip.events:
            truth = dataset.labels[event.name]
            rounds = [Row(event.name, size, 0), Row(event.name, size, 1)]
            first = {seed: out / f"{event.name}-r0-s{seed}" for seed in seeds}
            for seed, path in first.items():
                rounds[0].train_seconds.append(train(dataset, event.name, size, clip.train_stop, seed, path))
            reviewed = sent_frames(dataset, list(first.values()), window)
            second = {}
            for seed, path in first.items():
                labels = feedback_labels(truth, reviewed[path], window, marks)
                labelled = dataclasses.replace(dataset, labels={**dataset.labels, event.name: labels})
                second[seed] = out / f"{event.name}-r1-s{seed}"
                rounds[1].train_seconds.append(train(labelled, event.name, size, feedback_stop, seed, second[seed]))
                rounds[1].labelled.append(int((labels[window[0] : window[1]] != UNCERTAIN).sum()))
            for row, bundles in zip(rounds, (first, second), strict=True):
                matched = sent_frames(dataset, list(bundles.values()), final)
                for seed, path in bundles.items():
                    predicted = matched_mask(matched[path].frames, final)
                    scores = event_f1(truth[final[0] : final[1]], predicted, BOUNDARY_TOLERANCE)
                    row.seeds.append(seed)
                    row.f1.append(scores.f1)
                    row.precision.append(scores.precision)
                    row.event_recall.append(scores.event_recall)
                log.info("%s %s %dx%d round %d: F1 %s", clip.folder, event.name, *size, row.round, row.f1)
            rows += rounds
    return rows


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'event':<14} {'input':<9} {'round':>5} {'F1 mean':>7} {'min':>6} {'max':>6} {'prec':>6} {'recall':>6} "
        f"{'labelled':>8} {'train s':>7}  F1 per seed"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for row in rows:
        s = row.summary()
        print(
            f"{row.event:<14} {row.size[0]}x{row.size[1]:<5} {row.round:>5} {s['f1_mean']:7.3f} {s['f1_min']:6.3f} "
            f"{s['f1_max']:6.3f} {s['precision']:6.3f} {s['event_recall']:6.3f} {s['labelled']:8.1f} "
            f"{s['train_s']:7.1f}  {' '.join(f'{f:.3f}' for f in row.f1)}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_data = Path(os.environ.get("FILTERFORWARD_DATA", REPO.parent / "shared" / "data"))
    parser.add_argument("--data", type=Path, default=default_data, help="folder with the real clips")
    parser.add_argument("--seeds", type=seed_range, default=tuple(range(5)), help="seeds, e.g. 0-4 (default)")
    parser.add_argument(
        "--sizes", type=choices(("default", "half")), default=("default", "half"), help="input sizes to run"
    )
    parser.add_argument(
        "--marks", choices=MARKS, default=MARKS[0], help="how sent frames are marked: per event (default) or per frame"
    )
    parser.add_argument("--json", type=Path, help="also write every row (per-seed values) as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    if not args.data.is_dir():
        print(f"error: no clips at {args.data}: give --data or set FILTERFORWARD_DATA", file=sys.stderr)
        return 2
    rows: list[Row] = []
    try:
        for clip in (c for c in CLIPS if c.folder in FEEDBACK_STOP):
            dataset = open_clip(clip, args.data)
            for size_name in args.sizes:
                rows += score_clip(dataset, clip, input_size(dataset, size_name), args.seeds, args.marks)
                print_table(rows)
    except FilterForwardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        document = {
            "feedback_stop": FEEDBACK_STOP,
            "marks": args.marks,
            "splits": {c.folder: c.train_stop for c in CLIPS if c.folder in FEEDBACK_STOP},
            "tolerance": BOUNDARY_TOLERANCE,
            "cpus": os.cpu_count(),
            "rows": [{**dataclasses.asdict(r), "summary": r.summary()} for r in rows],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
