"""Development check for the motion veto's floor, on frames the generalization benchmark never tests.

The veto (models/motion.py) holds a frame back when fewer of the region's pixels moved than a floor derived from
the share that moved on 98% of the event's training frames. That share is the size of the smallest thing the
training frames showed doing the event: a smaller one later (a car farther away, a smaller object) moves fewer
pixels. Here the default filter is trained on each development case of tap_rule.py, and on synthetic clips whose
objects vary in size (the demo's clip is seed 0), then replayed over the case's test frames with its floor at each
of FLOOR_SCALES times that share (1: the veto until 2026-12-06; models.motion.FLOOR_SCALE since; 0: no veto).
Training does not depend on the floor (the veto only reaches the estimate the filter ships with), so one training
per case, size and seed serves every scale.

    python bench/veto_floor.py --seeds 0-2 --sizes half,default --json bench/out/veto_floor.json
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from generalization import REPO, input_size, open_clip
from tap_rule import CASES, Case, case_clip, case_parser, chosen_cases, write_outcomes

from edge.replay import replay
from models.bundle import load_bundle, write_bundle
from models.datasets import LabelledDataset, open_dataset, write_synthetic
from models.evaluation import BOUNDARY_TOLERANCE, event_f1
from models.model_selection import train_default
from models.motion import FLOOR_SCALE
from models.training import TrainConfig

log = logging.getLogger("bench.veto_floor")

FLOOR_SCALES = (1.0, 0.5, 0.25, 0.0)
SYNTHETIC = "synthetic"
SYNTHETIC_SEEDS = (0, 1, 2)  # clips of `filterforward dataset synth --frames 900 --seed S`; the demo's is 0
SYNTHETIC_FRAMES, SYNTHETIC_TRAIN = 900, 540  # the demo's clip and its split (--train-fraction 0.6)


@dataclasses.dataclass
class Outcome:
    case: str
    size: str
    seed: int
    share: float | None  # the training frames' share of moving pixels (the veto at scale 1); None: no veto
    test_f1: dict[str, float]  # floor scale -> event F1 on the case's test frames


def synthetic_cases(seeds: Sequence[int]) -> list[tuple[Case, LabelledDataset]]:
    """The demo's synthetic clips (kept in bench/out, made on first use) as cases of their red_in_region event."""
    cases = []
    for seed in seeds:
        folder = REPO / "bench" / "out" / f"{SYNTHETIC}-{seed}"
        if (folder / "labels.csv").is_file():
            dataset = open_dataset(folder)
        else:
            dataset = write_synthetic(folder, n_frames=SYNTHETIC_FRAMES, seed=seed, overwrite=True)
        cases.append((Case(f"{SYNTHETIC}-{seed}", "red_in_region", SYNTHETIC_TRAIN, SYNTHETIC_FRAMES), dataset))
    return cases


def with_floor_scale(bundle: Path, scale: float) -> tuple[Path, str]:
    """A copy of the bundle whose veto floor is `scale` times its training share (0: no veto), under a name of its
    own; its path and that name."""
    spec, onnx_bytes = load_bundle(bundle)
    motion = spec.motion
    if motion is not None:
        floor = motion.min_foreground * scale / FLOOR_SCALE
        motion = motion.model_copy(update={"min_foreground": floor}) if scale else None
    name = f"{spec.name}-x{scale:g}"
    scaled = spec.model_copy(update={"name": name, "motion": motion})
    return write_bundle(bundle.with_name(f"{bundle.name}-x{scale:g}"), scaled, onnx_bytes), name


def run_case(case: Case, dataset: LabelledDataset, size: str, seeds: Sequence[int]) -> list[Outcome]:
    test = (case.train_stop, case.test_stop)
    truth = dataset.labels[case.event][test[0] : test[1]]
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="ff-veto-floor-") as folder:
        variants: dict[Path, tuple[Outcome, str, str]] = {}  # bundle -> its outcome, floor scale, filter name
        for seed in seeds:
            config = TrainConfig(
                event=case.event,
                architecture="full_frame",
                input_size=input_size(dataset, size),
                roi=dataset.roi(case.event),
                frames=(0, case.train_stop),
                seed=seed,
                name=f"{case.event}-{seed}".replace("_", "-"),
            )
            bundle = Path(folder) / f"seed-{seed}"
            result, _ = train_default(dataset, config, bundle, progress=False)
            share = result.spec.motion.min_foreground / FLOOR_SCALE if result.spec.motion else None
            outcome = Outcome(f"{case.clip} {case.event}", size, seed, share, {})
            outcomes.append(outcome)
            for scale in FLOOR_SCALES:
                copy, name = with_floor_scale(bundle, scale)
                variants[copy] = (outcome, f"{scale:g}", name)
            log.info("%s %s %s seed %d: share %s", case.clip, case.event, size, seed, share)
        sink = replay(dataset, list(variants), test, progress=False, gate=None)
        for outcome, scale, name in variants.values():
            predicted = np.zeros(test[1] - test[0], bool)
            predicted[np.asarray(sorted(sink.frames.get(name, ())), int) - test[0]] = True
            outcome.test_f1[scale] = event_f1(truth, predicted, BOUNDARY_TOLERANCE).f1
    return outcomes


def print_report(outcomes: list[Outcome]) -> None:
    scales = [f"{scale:g}" for scale in FLOOR_SCALES]
    print(f"\n{'case':<34} {'size':<8} {'seed':>4} {'share':>8}  " + "  ".join(f"x{s:<5}" for s in scales))
    for o in outcomes:
        share = f"{o.share:8.4f}" if o.share is not None else f"{'-':>8}"
        print(f"{o.case:<34} {o.size:<8} {o.seed:>4} {share}  " + "  ".join(f"{o.test_f1[s]:.3f}" for s in scales))
    print(f"\n{'floor scale':<12} {'mean F1':>8} {'worst':>6} {'< 0.8':>6} {'down > 0.01 vs x1':>18}")
    for scale in scales:
        f1 = [o.test_f1[scale] for o in outcomes]
        down = sum(o.test_f1[scale] < o.test_f1["1"] - 0.01 for o in outcomes)
        below = sum(value < 0.8 for value in f1)
        print(f"x{scale:<11} {statistics.fmean(f1):8.3f} {min(f1):6.3f} {below:>6} {down:>18}")


def main(argv: Sequence[str] | None = None) -> int:
    args = case_parser(__doc__, log).parse_args(argv)
    cases = [(case, open_clip(case_clip(case), args.data)) for case in chosen_cases(CASES, args.cases)]
    if not args.cases or SYNTHETIC in args.cases:
        cases += synthetic_cases(SYNTHETIC_SEEDS)
    outcomes: list[Outcome] = []
    for case, dataset in cases:
        for size in args.sizes.split(","):
            outcomes += run_case(case, dataset, size, args.seeds)
        print_report(outcomes)
    write_outcomes(args.json, outcomes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
