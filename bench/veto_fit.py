"""What the motion veto's fit needs of its training frames, on every region event of bench/generalization.py.

1. Sampled frames: the veto fitted on a background model that saw every k-th frame of the clip (a studio dataset of
   footage requested every k frames) and applied as the edge applies it, to a model that sees every frame: how many
   of the event's frames it would hold back, for k = 1, 2, 4, 8, 16.
2. Settling: how many frames a fresh background model (started at frames 100-300) takes until its region fractions
   agree, within 0.005, for 10 frames in a row, with those of a model that has watched the clip from its start.

Both over whole clips, labels included (they measure the background model, not a filter).

    python bench/veto_fit.py
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from generalization import CLIPS, REPO, open_clip

from models.motion import fit_veto, foreground_fractions, still
from models.roi import ROI

STEPS = (1, 2, 4, 8, 16)
STARTS = (100, 150, 200, 250, 300)
AGREE, AGREE_FOR, LOOK = 0.005, 10, 70  # within this of the watched model, this many frames in a row, this far


def held_back(frames: list[tuple[int, np.ndarray]], labels: np.ndarray, roi: ROI, full: np.ndarray) -> dict[int, dict]:
    """Per step k: the floor fitted on every k-th frame, and the event frames it holds back on every frame."""
    out = {}
    for k in STEPS:
        veto = fit_veto(foreground_fractions(frames[::k], roi), labels[::k])
        held = still(full, veto) & (labels == 1)
        out[k] = {"floor": veto.min_foreground if veto else 0.0, "held": int(held.sum())}
    return out


def settling(frames: list[tuple[int, np.ndarray]], roi: ROI, full: np.ndarray) -> list[int | None]:
    """Frames a fresh model started at each of STARTS needs to agree with the watched one (None: not within LOOK)."""
    needed = []
    for start in STARTS:
        fresh = foreground_fractions(frames[start : start + LOOK + AGREE_FOR], roi)
        close = np.abs(fresh - full[start : start + LOOK + AGREE_FOR]) < AGREE
        needed.append(next((i for i in range(LOOK) if close[i : i + AGREE_FOR].all()), None))
    return needed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="folder with the clips")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="folder for JSON and plot")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"error: no clips at {args.data}: give --data", file=sys.stderr)
        return 2
    rows = []
    for clip in CLIPS:
        dataset = open_clip(clip, args.data)
        frames = list(dataset.frames())  # (index, image), as foreground_fractions takes them
        for event in clip.events:
            roi, labels = dataset.roi(event.name), dataset.labels[event.name]
            full = foreground_fractions(frames, roi)
            rows.append({"clip": clip.folder, "event": event.name, "fps": dataset.fps,
                         "positives": int((labels == 1).sum()), "steps": held_back(frames, labels, roi, full),
                         "settling": settling(frames, roi, full)})  # fmt: skip
    print("event frames the edge would hold back with a veto fitted on every k-th frame (floor in brackets)")
    print(f"{'clip':22s} {'event':20s} {'fps':>5s} " + " ".join(f"{'k=' + str(k):>16s}" for k in STEPS))
    for r in rows:
        cells = " ".join(f"{s['held']:4d}/{r['positives']:<4d}({s['floor']:.3f})" for s in r["steps"].values())
        print(f"{r['clip']:22s} {r['event']:20s} {r['fps']:5.1f} {cells}")
    print(f"\nframes a fresh model needs to agree with a watched one (started at frames {', '.join(map(str, STARTS))})")
    for r in rows:
        print(f"{r['clip']:22s} {r['event']:20s} " + " ".join(f"{'-' if n is None else n:>4}" for n in r["settling"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "veto_fit.json").write_text(json.dumps(rows, indent=2))
    plot(rows, args.out / "veto_fit.png")
    print(f"wrote {args.out / 'veto_fit.json'} and {args.out / 'veto_fit.png'}")
    return 0


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    plt.figure(figsize=(6, 4))
    for r in rows:
        shares = [100 * s["held"] / r["positives"] for s in r["steps"].values()]
        plt.plot(STEPS, shares, marker="o", label=f"{r['clip'].split('-')[0]} {r['event']}")
    plt.xscale("log", base=2)
    plt.xlabel("veto fitted on every k-th frame")
    plt.ylabel("event frames held back on every frame (%)")
    plt.legend(fontsize=8)
    plt.tight_layout()
    plt.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
