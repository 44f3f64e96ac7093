"""`filterforward edge run` as a real process: config in, matched frames and events out, clean errors."""

from __future__ import annotations

import json
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from models.bundle import write_bundle
from models.errors import FilterForwardError
from models.memory import GIB, check_edge_memory

SIZE = (384, 224)


def filterforward(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "filterforward", *args], capture_output=True, text=True, timeout=300, **kwargs
    )


@pytest.fixture
def config(tmp_path, short_clip, make_filter) -> Path:
    bundle = write_bundle(tmp_path / "always", *make_filter("full_frame", "late", SIZE, name="always", bias=10.0))
    path = tmp_path / "edge.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "edge_id": "test-edge",
                "input_size": list(SIZE),
                "cameras": [{"name": "gate", "source": str(short_clip), "pacing": "every-frame"}],
                "filters": [bundle.name],  # relative to the config file
                "sink": {"path": "out"},
                "stats_interval": 0.5,
            }
        )
    )
    return path


def test_edge_run_writes_matched_frames_and_events(config: Path) -> None:
    result = filterforward("edge", "run", "--config", str(config))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (config.parent / "out" / "events.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "frame" for r in records) == 40
    assert [r["type"] for r in records if r["type"].startswith("event")] == ["event_start", "event_end"]
    fragments = [r for r in records if r["type"] == "fragment"]  # the default encoding: the camera's stream
    assert [i for r in fragments for i in r["frames"]] == list(range(40))
    assert all((config.parent / "out" / r["file"]).stat().st_size > 0 for r in fragments)
    assert not (config.parent / "out" / "frames" / "gate").exists()  # no JPEGs
    assert "camera gate:" in result.stderr and "fps" in result.stderr  # the periodic stats line


def test_a_filter_for_none_of_the_edge_s_cameras_is_named_in_a_warning(config: Path, make_filter) -> None:
    spec, onnx = make_filter("full_frame", "late", SIZE, name="elsewhere", bias=10.0, cameras=["loading-dock"])
    write_bundle(config.parent / "elsewhere", spec, onnx)
    data = yaml.safe_load(config.read_text())
    data["filters"].append("elsewhere")
    config.write_text(yaml.safe_dump(data))
    result = filterforward("edge", "run", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert (
        "filter elsewhere is for cameras loading-dock, none of which this edge has (gate): it runs nowhere"
        in result.stderr
    )
    assert "filter always is for cameras" not in result.stderr  # '*': every camera


def test_an_edge_without_filters_says_it_will_match_nothing(config: Path) -> None:
    data = yaml.safe_load(config.read_text())
    data["filters"] = []
    config.write_text(yaml.safe_dump(data))
    result = filterforward("edge", "run", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "no filters: nothing will be matched; list filter bundles under filters:, or add a cloud:" in result.stderr


def test_sigterm_stops_a_realtime_camera_cleanly(config: Path) -> None:
    data = yaml.safe_load(config.read_text())
    data["cameras"][0]["pacing"] = "realtime"
    config.write_text(yaml.safe_dump(data))
    events = config.parent / "out" / "events.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "filterforward", "edge", "run", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (events.exists() and events.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    lines = events.read_text().splitlines()
    assert json.loads(lines[-1])["type"] == "event_end"  # the open event was closed on the way out
    assert len(lines) - 2 < 40  # stopped before the end of the clip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cameras": [{"name": "gate", "source": "x.mp4", "colour": "red"}]}, "cameras.0.colour"),
        ({"input_size": [100, 100]}, "multiples of 32"),
        ({"cameras": [{"name": "gate", "source": "/nowhere/clip.mp4"}]}, "/nowhere/clip.mp4"),
        ({"filters": ["missing-bundle"]}, "missing-bundle"),
        # Two bundles of one name would run as one filter twice over, their events indistinguishable.
        ({"filters": ["always", "always-copy"]}, "/always-copy are both named 'always': drop one"),
    ],
)
def test_bad_config_is_one_clear_line(config: Path, change: dict, message: str) -> None:
    data = yaml.safe_load(config.read_text())
    data.update(change)
    config.write_text(yaml.safe_dump(data))
    shutil.copytree(config.parent / "always", config.parent / "always-copy")
    result = filterforward("edge", "run", "--config", str(config))
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_unreadable_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("cameras: [unclosed\n")
    assert "not valid YAML" in filterforward("edge", "run", "--config", str(bad)).stderr
    result = filterforward("edge", "run", "--config", str(tmp_path / "none.yaml"))
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_the_example_config_is_valid() -> None:
    from edge.config import load_edge_config

    config = load_edge_config(Path(__file__).parents[1] / "deploy" / "edge.example.yaml")
    assert config.cameras[0].pacing == "realtime" and config.input_size == (768, 448)


def test_a_sink_folder_that_cannot_be_created_is_one_line(config: Path) -> None:
    settings = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**settings, "sink": {"path": "/proc/no-such/out"}}))
    result = filterforward("edge", "run", "--config", str(config))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("filterforward edge: error: cannot use the sink folder /proc/no-such/out (")
    assert "Traceback" not in result.stderr


def test_a_recording_corrupt_mid_stream_is_reported_and_the_exit_status_says_so(config: Path) -> None:
    import cv2
    import numpy as np

    video = config.parent / "broken.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (160, 120))
    noise = np.random.default_rng(0)
    for _ in range(40):
        writer.write(noise.integers(0, 255, (120, 160, 3), dtype=np.uint8))
    writer.release()
    data = bytearray(video.read_bytes())
    data[len(data) // 2 : len(data) * 3 // 4] = bytes(len(data) * 3 // 4 - len(data) // 2)  # zeroed from the middle
    video.write_bytes(bytes(data))
    settings = yaml.safe_load(config.read_text())
    settings["cameras"][0]["source"] = str(video)
    config.write_text(yaml.safe_dump(settings))
    result = filterforward("edge", "run", "--config", str(config))
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"filterforward edge: error: camera gate: the recording ended early, at frame \d+ of 40: the file is "
        r"truncated or corrupt from there \(the frames before it were filtered\)",
        last,
    ), last
    matched = [json.loads(line) for line in (config.parent / "out" / "events.jsonl").read_text().splitlines()]
    assert any(record["type"] == "frame" for record in matched)  # the frames before the damage went through


def test_a_camera_whose_file_is_no_video_is_named_in_the_error(config: Path) -> None:
    """With several cameras, "x.mp4 can't be decoded as video" did not say which camera to fix."""
    (config.parent / "notes.mp4").write_text("not a video\n")
    settings = yaml.safe_load(config.read_text())
    settings["cameras"].append({"name": "yard", "source": "notes.mp4"})
    config.write_text(yaml.safe_dump(settings))
    result = filterforward("edge", "run", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"filterforward edge: error: camera yard: {config.parent / 'notes.mp4'} can't be decoded as video; check that "
        "it is a video file that plays"
    )


def test_an_input_size_the_edge_cannot_run_in_its_memory_is_refused_at_start(config: Path) -> None:
    """An edge at a size its memory cannot hold started, then the OOM killer ended it at the first frames without a
    word. The CLI runs under a 12 GiB address-space limit (`ulimit -v`), which the check counts, so the test does not
    depend on this machine's memory."""
    settings = yaml.safe_load(config.read_text())
    settings["input_size"] = [8192, 8192]
    settings["cameras"].append({**settings["cameras"][0], "name": "yard"})  # two cameras: twice the memory
    config.write_text(yaml.safe_dump(settings))
    limit = 12 * GIB
    result = filterforward(
        "edge",
        "run",
        "--config",
        str(config),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    assert result.returncode == 2, result.stderr
    assert re.fullmatch(
        r"filterforward edge: error: input_size 8192x8192 needs about 12\.5 GiB of memory for the base DNN of 2 "
        r"camera\(s\) but \d+\.\d GiB is available: set input_size to (\d+)x\1 or smaller, or run fewer cameras on "
        r"this edge",
        result.stderr.strip().splitlines()[-1],
    ), result.stderr
    check_edge_memory((768, 448), cameras=8, available=GIB)  # the default size fits in a small box
    with pytest.raises(FilterForwardError, match=r"but 1\.0 GiB is available: set input_size to 4352x2432 or smaller$"):
        check_edge_memory((7680, 4320), cameras=1, available=GIB)
