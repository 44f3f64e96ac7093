"""What the motion veto's background model costs the edge a frame: a model of the whole frame against one of the
region's box only (models.motion.ForegroundMeter), for every region event of bench/generalization.py.

Both models see the same frames of the clip in turn, in one process, with OpenCV's default threads (as on the
edge); a row is the median over the frames after the first 20, and the fractions of the two must be equal.

    python bench/veto_cost.py                  # frames 100-200 of each clip
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from generalization import CLIPS, REPO, open_clip

from models.motion import ForegroundMeter
from models.roi import ROI

WARM_UP = 20  # frames not timed: the first frames of a fresh model are all foreground


def time_meter(meter: ForegroundMeter, image: np.ndarray, roi: ROI) -> tuple[float, float]:
    """(seconds, region fraction) of one frame through the meter."""
    started = time.perf_counter()
    fraction = meter.fraction(meter.foreground(image), roi)
    return time.perf_counter() - started, fraction


def measure(data: Path, frames: tuple[int, int]) -> list[dict[str, object]]:
    rows = []
    for clip in CLIPS:
        dataset = open_clip(clip, data)
        images = [image for _, image in dataset.frames(*frames)]
        for event in clip.events:
            roi = dataset.roi(event.name)
            whole, boxed = ForegroundMeter(), ForegroundMeter([roi])
            times: dict[str, list[float]] = {"whole": [], "box": []}
            for image in images:
                (whole_s, expected), (box_s, fraction) = time_meter(whole, image, roi), time_meter(boxed, image, roi)
                if fraction != expected:
                    raise AssertionError(f"{clip.folder} {event.name}: box {fraction} != whole frame {expected}")
                times["whole"].append(whole_s)
                times["box"].append(box_s)
            whole_ms, box_ms = (statistics.median(times[k][WARM_UP:]) * 1e3 for k in ("whole", "box"))
            height, width = images[0].shape[:2]
            rows.append({"clip": clip.folder, "event": event.name, "frame": f"{width}x{height}",
                         "whole_ms": whole_ms, "box_ms": box_ms})  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="folder with the clips")
    parser.add_argument("--frames", default="100:200", help="frames of each clip, start:stop")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="folder for JSON and plot")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"error: no clips at {args.data}: give --data", file=sys.stderr)
        return 2
    start, stop = (int(part) for part in args.frames.split(":"))
    rows = measure(args.data, (start, stop))
    print(f"{'clip':22s} {'event':20s} {'frame':>10s} {'whole ms':>9s} {'box ms':>7s} {'whole/box':>9s}")
    for r in rows:
        ratio = r["whole_ms"] / r["box_ms"]
        print(
            f"{r['clip']:22s} {r['event']:20s} {r['frame']:>10s} {r['whole_ms']:9.2f} {r['box_ms']:7.2f} {ratio:9.2f}x"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "veto_cost.json").write_text(json.dumps(rows, indent=2))
    plot(rows, args.out / "veto_cost.png")
    print(f"wrote {args.out / 'veto_cost.json'} and {args.out / 'veto_cost.png'}")
    return 0


def plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    labels = [f"{r['clip'].split('-')[0]} {r['event']}" for r in rows]
    positions = range(len(rows))
    plt.figure(figsize=(8, 3.5))
    plt.bar([p - 0.2 for p in positions], [r["whole_ms"] for r in rows], 0.4, label="whole frame")
    plt.bar([p + 0.2 for p in positions], [r["box_ms"] for r in rows], 0.4, label="region's box")
    plt.xticks(list(positions), labels, rotation=15, fontsize=8)
    plt.ylabel("ms per frame (median)")
    plt.title("motion veto's background model")
    plt.legend()
    plt.tight_layout()
    plt.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
