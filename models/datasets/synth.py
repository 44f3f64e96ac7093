"""Synthetic labelled camera scenes for tests and demos: coloured shapes crossing a textured, noisy view.

The scene is planned as a sequence of short episodes (a red object stopping inside region R, a red
object stopping elsewhere while a distractor visits R, a blue object passing, ...), shuffled per round
so every event recurs throughout the clip and can be trained on its start and evaluated on the rest.
Labels come from the planned geometry; frames where an object is only partly in view, or its centre is
near R's edge, are uncertain (-1). The clip is H.264 (libx264, yuv420p) written with PyAV.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
from tqdm import tqdm

from models.datasets.labelled import CONFIG_FILE, LABELS_FILE, LabelledDataset, check_output, write_labelled
from models.errors import FilterForwardError
from models.progress import progress_bar
from models.roi import ROI

log = logging.getLogger(__name__)

VIDEO_FILE = "video.mp4"
REGION = ROI(x0=0.55, y0=0.2, x1=0.9, y1=0.8)  # "R" of red_in_region
EVENTS = ("red_in_region", "blue_present", "any_object")
COLOURS: dict[str, tuple[int, int, int]] = {  # BGR, saturated so colour alone tells them apart
    "red": (40, 35, 215),
    "green": (50, 185, 45),
    "blue": (215, 95, 30),
    "yellow": (35, 215, 230),
    "white": (238, 238, 238),
}
DISTRACTORS = ("green", "yellow", "white")
SHAPES = ("circle", "square", "triangle")
# Centre-to-corner distance per unit size: a circle's radius, a square's half-diagonal, the triangle's corners.
REACH = {"circle": 0.5, "square": 0.5 * np.sqrt(2), "triangle": 0.575}
# Episode kind -> the objects it sends in: (colour, where it stops). "other" is a random distractor colour.
EPISODES: dict[str, tuple[tuple[str, str], ...]] = {
    "red_in_region": (("red", "region"), ("other", "away")),
    "red_elsewhere": (("red", "away"), ("other", "region")),
    "blue": (("blue", "anywhere"), ("other", "anywhere")),
    "red_and_blue": (("red", "region"), ("blue", "away")),
}
MIN_SIZE = 64  # pixels, each side
MIN_FPS, MAX_FPS = 1, 240  # frames per second
MAX_FRAMES = 100_000  # almost two hours at 15 fps: longer clips only sat planning their tracks, silently
NOISE_SIGMA = 3.0  # grey levels of per-frame sensor noise
# Tuned so that at 600 frames each event is positive on ~10-30% of frames (any_object ~40%) and recurs 3-7 times.
GAP = (30, 70)  # empty frames between episodes
SPEED = (0.045, 0.075)  # frame widths per frame
DWELL_LONG = (12, 30)  # frames a red or blue object stays at its stop
DWELL = (4, 12)  # frames a distractor stays


@dataclass(frozen=True, eq=False)
class Track:
    """One object's life in the clip: centre positions (pixels) for frames start .. start+len(path)-1."""

    colour: str
    shape: str
    size: float  # diameter / side in pixels
    start: int
    path: np.ndarray  # (n, 2) float centres
    spin: float  # radians per frame (squares and triangles turn)

    @property
    def reach(self) -> float:
        """Farthest a pixel of the shape lies from its centre."""
        return self.size * REACH[self.shape]


def write_synthetic(
    out_dir: str | Path,
    n_frames: int = 600,
    size: tuple[int, int] = (320, 192),
    fps: float = 15.0,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = False,
) -> LabelledDataset:
    """Render a synthetic scene into out_dir (video.mp4, labels.csv, dataset.yaml); same seed, same clip."""
    width, height = _check_args(n_frames, size, fps, seed)
    out = Path(out_dir).expanduser()
    check_output(out, [VIDEO_FILE, LABELS_FILE, CONFIG_FILE], overwrite)
    plan_seed, render_seed = np.random.SeedSequence(seed).spawn(2)
    tracks = plan_tracks(n_frames, (width, height), np.random.default_rng(plan_seed))
    frames = _render(tracks, n_frames, (width, height), np.random.default_rng(render_seed))
    _encode(frames, out / VIDEO_FILE, (width, height), fps, progress_bar(progress, total=n_frames, unit="frame"))
    labels = {event: label_event(event, tracks, n_frames, (width, height)) for event in EVENTS}
    dataset = LabelledDataset(
        root=out,
        name=f"synthetic-{seed}",
        source=out / VIDEO_FILE,
        fps=fps,
        frame_size=(width, height),
        n_frames=n_frames,
        labels=labels,
        regions={"red_in_region": REGION},
    )
    written = write_labelled(
        dataset, out, extra_columns={"n_objects": _count_visible(tracks, n_frames, (width, height))}, overwrite=True
    )
    if written.n_frames != n_frames:
        raise FilterForwardError(
            f"{out / VIDEO_FILE} decodes to {written.n_frames} frames, not {n_frames}: "
            "the installed FFmpeg/libx264 is broken"
        )
    return written


def _check_args(n_frames: int, size: tuple[int, int], fps: float, seed: int) -> tuple[int, int]:
    width, height = size
    if width < MIN_SIZE or height < MIN_SIZE or width % 2 or height % 2:
        raise FilterForwardError(f"size {width}x{height} does not work: use even numbers, each at least {MIN_SIZE}")
    if not 1 <= n_frames <= MAX_FRAMES:
        raise FilterForwardError(f"{n_frames} frames asked for: give 1 to {MAX_FRAMES:,}")
    if not MIN_FPS <= fps <= MAX_FPS:  # an MP4's rate is a fraction: 1e-9 or inf cannot be one
        raise FilterForwardError(f"fps {fps} does not work: give a frame rate from {MIN_FPS} to {MAX_FPS}")
    if seed < 0:
        raise FilterForwardError(f"seed {seed} does not work: give 0 or more")
    return width, height


# --- planning -------------------------------------------------------------------------------------


def plan_tracks(n_frames: int, size: tuple[int, int], rng: np.random.Generator) -> list[Track]:
    """Episodes one after another with idle gaps, in a fresh random order each round."""
    tracks: list[Track] = []
    frame = int(rng.integers(5, 25))
    kinds = list(EPISODES)
    while frame < n_frames:
        for kind in rng.permutation(kinds):
            episode = _episode(str(kind), frame, size, rng)
            tracks += episode
            frame = max(t.start + len(t.path) for t in episode) + int(rng.integers(GAP[0], GAP[1]))
            if frame >= n_frames:
                break
    return tracks


def _episode(kind: str, start: int, size: tuple[int, int], rng: np.random.Generator) -> list[Track]:
    tracks = []
    for colour, zone in EPISODES[kind]:
        name = str(rng.choice(DISTRACTORS)) if colour == "other" else colour
        tracks.append(_track(name, zone, start, size, rng))
        start += int(rng.integers(0, 8))  # the next object follows a little later
    return tracks


def _track(colour: str, zone: str, start: int, size: tuple[int, int], rng: np.random.Generator) -> Track:
    """Enter from a random edge, move to a stop in `zone`, wait there, leave by a random edge."""
    width, height = size
    shape = str(rng.choice(SHAPES))
    diameter = float(rng.uniform(0.14, 0.26) * min(width, height))
    speed = float(rng.uniform(*SPEED) * width)
    stop = _stop_point(zone, diameter, size, rng)
    entry, leave = (_edge_point(diameter * REACH[shape], size, rng) for _ in range(2))
    # The colours events are about linger longer, so their events last a while.
    dwell = int(rng.integers(*(DWELL_LONG if colour in ("red", "blue") else DWELL)))
    wobble = stop + np.outer(np.sin(np.linspace(0, np.pi, dwell)), rng.uniform(-0.1, 0.1, 2) * diameter)
    path = np.concatenate([_line(entry, stop, speed), wobble, _line(stop, leave, speed)])
    return Track(colour, shape, diameter, start, path, float(rng.uniform(-0.08, 0.08)))


def _stop_point(zone: str, diameter: float, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    width, height = size
    low, high = np.array([diameter, diameter]) / 2, np.array([width, height]) - diameter / 2
    if zone == "region":  # well inside R
        low = np.maximum(low, [REGION.x0 * width + diameter / 2, REGION.y0 * height + diameter / 2])
        high = np.minimum(high, [REGION.x1 * width - diameter / 2, REGION.y1 * height - diameter / 2])
    while True:
        point = rng.uniform(low, high)
        if zone != "away" or _region_distance(point[None], size)[0] < -diameter:
            return point


def _edge_point(reach: float, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """A point just outside a random edge, so the object starts or ends fully out of view."""
    width, height = size
    outside = reach + 2
    along = rng.uniform(0.1, 0.9)
    side = int(rng.integers(4))
    return np.array(
        [
            (-outside, along * height),
            (width + outside, along * height),
            (along * width, -outside),
            (along * width, height + outside),
        ][side]
    )


def _line(start: np.ndarray, end: np.ndarray, speed: float) -> np.ndarray:
    steps = max(int(np.ceil(np.linalg.norm(end - start) / speed)), 1)
    return start + np.outer(np.arange(steps) / steps, end - start)


# --- labels ---------------------------------------------------------------------------------------


def _box_distance(points: np.ndarray, box: tuple[float, float, float, float]) -> np.ndarray:
    """Signed distance (pixels) of each (x, y) point from a box's border: positive inside."""
    x0, y0, x1, y1 = box
    x, y = points[:, 0], points[:, 1]
    inside = np.minimum.reduce([x - x0, x1 - x, y - y0, y1 - y])
    dx = np.maximum.reduce([x0 - x, np.zeros_like(x), x - x1])
    dy = np.maximum.reduce([y0 - y, np.zeros_like(y), y - y1])
    return np.where(inside >= 0, inside, -np.hypot(dx, dy))


def _region_distance(points: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    width, height = size
    return _box_distance(points, (REGION.x0 * width, REGION.y0 * height, REGION.x1 * width, REGION.y1 * height))


def _track_states(event: str, track: Track, size: tuple[int, int]) -> np.ndarray:
    """1, 0 or -1 per frame of a track. Uncertain: the centre is within a quarter of the object's size of
    R's border (region event), or the object is in view with its centre not clearly inside (presence)."""
    in_view = _box_distance(track.path, (0.0, 0.0, float(size[0]), float(size[1])))
    wanted = {"red_in_region": "red", "blue_present": "blue"}.get(event, track.colour)
    if track.colour != wanted:
        return np.zeros(len(track.path), dtype=np.int8)
    margin = track.size / 4
    if event == "red_in_region":
        distance, absent = _region_distance(track.path, size), -margin
    else:
        distance, absent = in_view, -track.reach  # any visible sliver is at least uncertain
    states = np.where(distance > margin, 1, np.where(distance <= absent, 0, -1)).astype(np.int8)
    states[in_view <= -track.reach] = 0  # entirely out of view
    return states


def label_event(event: str, tracks: list[Track], n_frames: int, size: tuple[int, int]) -> np.ndarray:
    """Per-frame label: 1 if any object makes the event true, else -1 if any makes it uncertain, else 0."""
    positive = np.zeros(n_frames, dtype=bool)
    uncertain = np.zeros(n_frames, dtype=bool)
    for track in tracks:
        frames = track.start + np.arange(len(track.path))
        keep = frames < n_frames
        states, frames = _track_states(event, track, size)[keep], frames[keep]
        positive[frames[states == 1]] = True
        uncertain[frames[states == -1]] = True
    return np.where(positive, 1, np.where(uncertain, -1, 0)).astype(np.int8)


def _count_visible(tracks: list[Track], n_frames: int, size: tuple[int, int]) -> np.ndarray:
    """Objects whose centre is in view, per frame (written to labels.csv for information)."""
    counts = np.zeros(n_frames, dtype=np.int64)
    for track in tracks:
        frames = track.start + np.arange(len(track.path))
        seen = (frames < n_frames) & (_box_distance(track.path, (0.0, 0.0, float(size[0]), float(size[1]))) > 0)
        counts[frames[seen]] += 1
    return counts


def _schedule(tracks: list[Track], n_frames: int) -> list[list[Track]]:
    """The tracks in view on each frame, largest first (so smaller objects are drawn on top)."""
    per_frame: list[list[Track]] = [[] for _ in range(n_frames)]
    for track in sorted(tracks, key=lambda t: -t.size):
        for frame in range(track.start, min(track.start + len(track.path), n_frames)):
            per_frame[frame].append(track)
    return per_frame


# --- rendering ------------------------------------------------------------------------------------


def _background(size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """A low-saturation texture: smooth blotches, fine grain and a few darker lane lines (float32 BGR)."""
    width, height = size
    coarse = cv2.resize(
        rng.uniform(70, 160, (height // 24 + 2, width // 24 + 2)).astype(np.float32),
        (width, height),
        interpolation=cv2.INTER_CUBIC,
    )
    grain = cv2.GaussianBlur(rng.normal(0, 10, (height, width)).astype(np.float32), (0, 0), 1.0)
    gray = coarse + grain
    for y in rng.uniform(0.1, 0.9, 3) * height:
        gray[int(y) : int(y) + max(height // 60, 1)] *= 0.75
    tint = np.array([0.97, 1.0, 1.03], dtype=np.float32)  # slightly warm, far from the object colours
    return gray[..., None] * tint


def _draw(canvas: np.ndarray, track: Track, centre: np.ndarray, frame: int) -> None:
    colour = COLOURS[track.colour]
    if track.shape == "circle":
        cv2.circle(canvas, (round(centre[0]), round(centre[1])), round(track.reach), colour, -1, cv2.LINE_AA)
        return
    corners = 4 if track.shape == "square" else 3
    angles = track.spin * (frame - track.start) + np.pi / 4 + 2 * np.pi * np.arange(corners) / corners
    points = centre + track.reach * np.column_stack([np.cos(angles), np.sin(angles)])
    cv2.fillPoly(canvas, [np.round(points).astype(np.int32)], colour, cv2.LINE_AA)


def _render(
    tracks: list[Track], n_frames: int, size: tuple[int, int], rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """BGR uint8 frames: background, objects (smaller on top, so none hides completely), drift and noise."""
    width, height = size
    background = _background(size, rng).clip(0, 255).astype(np.uint8)
    period, phase = rng.uniform(150, 400), rng.uniform(0, 2 * np.pi)
    # Sensor noise: a random window of one larger noise field per frame, far cheaper than fresh noise.
    noise = rng.standard_normal((2 * height, 2 * width, 3), dtype=np.float32) * NOISE_SIGMA
    for frame, in_view in enumerate(_schedule(tracks, n_frames)):
        canvas = background.copy()
        for track in in_view:
            _draw(canvas, track, track.path[frame - track.start], frame)
        gain = 1.0 + 0.12 * np.sin(2 * np.pi * frame / period + phase)  # slow auto-exposure-like drift
        y, x = rng.integers(height), rng.integers(width)
        yield (canvas.astype(np.float32) * gain + noise[y : y + height, x : x + width]).clip(0, 255).astype(np.uint8)


def _encode(frames: Iterator[np.ndarray], path: Path, size: tuple[int, int], fps: float, bar: tqdm) -> None:
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        # Macroblock-tree rate control made the output differ now and then between identical runs.
        stream.options = {"crf": "18", "preset": "veryfast", "x264-params": "mbtree=0"}
        for index, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts = index
            container.mux(stream.encode(frame))
            bar.update()
        container.mux(stream.encode())
    bar.close()
    log.debug("wrote %s", path)
