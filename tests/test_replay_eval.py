"""Train on part of a real clip, replay the rest through the edge, score it: the issue's acceptance path."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import with_encoding

from edge.replay import evaluate
from models.datasets import open_dataset
from models.errors import FilterForwardError
from models.evaluation import scored_frames
from models.training import TrainConfig, train_mc

# Frames 0:212 hold the first half of the only red car's pass (187-238) plus two other cars; the rest is
# held out. The split was fixed before any evaluation run (never tuned on the held-out frames).
TRAIN, HELD_OUT = (0, 212), (212, 377)


def filterforward(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "filterforward", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def red_filter(intel_car: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dataset = open_dataset(intel_car)
    config = TrainConfig(event="red_vehicle_present", architecture="full_frame", input_size=(768, 448), frames=TRAIN)
    return train_mc(dataset, config, tmp_path_factory.mktemp("red"), progress=False).bundle


def test_red_vehicle_filter_finds_the_held_out_red_car(intel_car: Path, red_filter: Path) -> None:
    dataset = open_dataset(intel_car)
    report = evaluate(dataset, [red_filter], HELD_OUT, tolerance=2, progress=False)
    (scores,) = [f.scores for f in report.filters]
    assert scores.n_events == 1 and scores.existence == 1.0  # the red car's second half was found
    assert scores.f1 >= 0.6  # measured 0.85 (README); a filter that fires on the white car drops far below
    assert report.clip_bps < report.stream_bps  # sending events beats sending everything


def test_the_default_upload_is_the_stream_and_costs_a_fraction_of_the_whole_stream(
    intel_car: Path, red_filter: Path, tmp_path: Path
) -> None:
    dataset = open_dataset(intel_car)
    assert json.loads((red_filter / "spec.json").read_text())["encoding"]["kind"] == "stream"  # trained as default
    report = evaluate(dataset, [red_filter], HELD_OUT, tolerance=2, progress=False)
    assert 0 < report.upload_bps * 3 < report.jpeg_bps  # inter-frame coding beats a JPEG per frame
    assert report.upload_bps * 5 <= report.stream_bps  # issue 11's target on this clip (measured 7.0x)
    # upload_bps is what the filters' encodings send: with encoding jpeg, the matched frames' JPEGs.
    jpeg = evaluate(dataset, [with_encoding(red_filter, "jpeg", tmp_path / "jpeg")], HELD_OUT, progress=False)
    assert jpeg.upload_bps == pytest.approx(jpeg.jpeg_bps) and jpeg.upload_bps > report.upload_bps * 3


def test_frames_with_no_certain_label_are_refused_before_the_replay(intel_car: Path, red_filter: Path) -> None:
    """Event F1 over no scored frame would read 1.000."""
    dataset = open_dataset(intel_car)
    unsure = dataclasses.replace(dataset, labels={**dataset.labels, "unsure": np.full(dataset.n_frames, -1, np.int8)})
    with pytest.raises(FilterForwardError, match="frames 212:377 hold no frame labelled 0 or 1 for event 'unsure'"):
        evaluate(unsure, [red_filter], HELD_OUT, event="unsure", progress=False)
    # Likewise a tolerance that puts every labelled frame next to where the event starts or ends (precision read
    # 1.000 with nothing scored: a perfect score for a filter that fires everywhere).
    edges = np.full(dataset.n_frames, 0, np.int8)
    edges[HELD_OUT[0] + 30 :] = 1  # one transition: every held-out frame within 200 frames of it
    near = dataclasses.replace(dataset, labels={**dataset.labels, "near": edges})
    with pytest.raises(FilterForwardError, match="tolerance of 200 frames leaves no frame of 212:377 scored"):
        evaluate(near, [red_filter], HELD_OUT, event="near", tolerance=200, progress=False)
    assert scored_frames(edges[slice(*HELD_OUT)], 29) == HELD_OUT[1] - HELD_OUT[0] - 2 * 29


def test_a_range_without_the_event_or_with_training_frames_is_noted(intel_car: Path, red_filter: Path) -> None:
    """An event F1 over no labelled occurrence reads 1.000 for a filter that sends nothing, and one over training
    frames is optimistic: the report says so."""
    from filterforward.commands.eval import format_report

    dataset = open_dataset(intel_car)
    never = dataclasses.replace(dataset, labels={**dataset.labels, "never": np.zeros(dataset.n_frames, np.int8)})
    report = format_report(evaluate(never, [red_filter], HELD_OUT, event="never", progress=False))
    assert "note: frames 212:377 hold no occurrence of 'never': red_vehicle_present" in report
    report = format_report(evaluate(dataset, [red_filter], HELD_OUT, progress=False))
    assert "note:" not in report and "events = the events the filter reported" in report
    # Frames it was trained on (its bundle records them) score better than new footage will: said so.
    trained_on = json.loads((red_filter / "spec.json").read_text())["trained_on"]
    assert trained_on == {"dataset": dataset.name, "frames": [0, 212]}
    overlapping = evaluate(dataset, [red_filter], (150, 300), progress=False)
    assert overlapping.filters[0].trained_frames == (150, 212)
    expected = "note: frames 150:212 of those evaluated are among red_vehicle_present-full_frame's training frames"
    assert expected in format_report(overlapping)  # it was trained on 0:212: "trained on frames 150:212" misled


def test_a_filter_for_named_cameras_is_evaluated_all_the_same(
    intel_car: Path, red_filter: Path, tmp_path: Path
) -> None:
    """A replay is no camera of the filter's edges: before, such a filter never ran and scored 0.000."""
    dataset = open_dataset(intel_car)
    named = tmp_path / "named"
    shutil.copytree(red_filter, named)
    spec = json.loads((named / "spec.json").read_text())
    (named / "spec.json").write_text(json.dumps({**spec, "cameras": ["lobby"]}))
    [anywhere, lobby] = [evaluate(dataset, [b], HELD_OUT, progress=False).filters[0] for b in (red_filter, named)]
    assert lobby.matched_frames == anywhere.matched_frames > 0 and lobby.scores == anywhere.scores


def test_eval_command_prints_the_table_and_writes_json(intel_car: Path, red_filter: Path, tmp_path: Path) -> None:
    out = tmp_path / "reports" / "red" / "report.json"  # folders that do not exist yet are made
    # The last 165 frames (212:377), counted from the end as Python slices: before, -165 became 0 (every frame).
    result = filterforward("eval", str(intel_car), "--filter", str(red_filter), "--frames=-165:", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "red_vehicle_present" in result.stdout and "whole stream, H.264" in result.stdout
    report = json.loads(out.read_text())
    assert report["frames"] == [212, 377] and report["tolerance"] == 2
    assert 0.0 <= report["filters"][0]["scores"]["f1"] <= 1.0
    assert 0 < report["upload_bps"] < report["stream_bps"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--filter", "/no/such/bundle"], "/no/such/bundle"),
        (["--filter", "{red}", "--event", "purple_bus"], "no event 'purple_bus'"),
        (["--filter", "{red}", "--frames", "300:200"], "selects no frames"),
        (["--filter", "{red}", "--mc-weights", "int4"], "invalid choice: 'int4'"),
        (["--filter", "{red}", "--filter", "{red}"], "are both named 'red_vehicle_present"),
        # Checked before the replay: a wrong setting costs no replay and no report is lost at the end.
        (["--filter", "{red}", "--crf", "99"], "crf: Input should be less than or equal to 51"),
        (["--filter", "{red}", "--tolerance", "-1"], "boundary tolerance must be >= 0 frames, got -1"),
        (["--filter", "{red}", "--json", "{red}"], "is a folder, not a file: give a file path"),
        # The report was written over the filter's spec, which the next eval then refused.
        (["--filter", "{red}", "--json", "{red}/spec.json"], "spec.json, which this evaluation reads: write the"),
        (["--filter", "{red}", "--json", "/proc/no-such/report.json"], "report.json cannot be written: /proc "),
    ],
)
def test_eval_bad_input_is_one_line(intel_car: Path, red_filter: Path, args: list[str], message: str) -> None:
    result = filterforward("eval", str(intel_car), *(a.format(red=red_filter) for a in args))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_int8_fc_weights_keep_a_trained_localized_filters_f1(intel_car: Path, tmp_path: Path) -> None:
    """`filterforward eval --mc-weights int8` replays as an edge with `mc_weights: int8` runs: a localized MC's FC
    layers in int8 move its event F1 by at most issue 12's 0.01."""
    dataset = open_dataset(intel_car)
    config = TrainConfig(event="vehicle_present", architecture="localized", input_size=(384, 224), frames=TRAIN)
    bundle = train_mc(dataset, config, tmp_path / "localized", progress=False).bundle
    replayed = evaluate(dataset, [bundle], HELD_OUT, progress=False)
    fp32 = replayed.filters[0]
    assert fp32.scores.f1 > 0.5 and fp32.matched_frames > 20  # it finds the cars: there are decisions to change
    out = tmp_path / "int8.json"
    frames = f"{HELD_OUT[0]}:{HELD_OUT[1]}"
    result = filterforward("eval", str(intel_car), "--filter", str(bundle), "--frames", frames, "--mc-weights", "int8",
                           "--json", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "MC weights int8" in result.stdout and replayed.mc_weights == "fp32"
    report = json.loads(out.read_text())
    assert report["mc_weights"] == "int8"  # the flag reached the replayed bank (tests/test_mcfusion.py: it quantizes)
    int8 = report["filters"][0]
    assert int8["scores"]["f1"] == pytest.approx(fp32.scores.f1, abs=0.01)
    assert abs(int8["matched_frames"] - fp32.matched_frames) <= 2


def test_demo_refuses_a_folder_of_someone_else_s_files_and_bad_options_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from filterforward.cli import main
    from filterforward.commands.demo import claim_folder

    out = tmp_path / "mine"
    (out / "edge").mkdir(parents=True)
    (out / "edge" / "important.txt").write_text("keep me\n")  # the demo's edge/ would have been deleted
    assert main(["demo", "--frames", "60", "--out", str(out)]) == 2
    assert "holds files of its own" in capsys.readouterr().err and not (out / "synthetic").exists()
    assert (out / "edge" / "important.txt").read_text() == "keep me\n"
    for bad, message in [("--steps=0", "--steps must be at least 1"), ("--input-size=100x100", "multiples of 32")]:
        assert main(["demo", bad, "--out", str(tmp_path / "new")]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "new").exists()
    claim_folder(tmp_path / "new", force=False)  # a new folder becomes the demo's ...
    (tmp_path / "new" / "synthetic").mkdir()
    claim_folder(tmp_path / "new", force=False)  # ... and a later run writes in it again
    claim_folder(out, force=True)


def test_demo_runs_end_to_end_on_a_fresh_synthetic_clip(tmp_path: Path) -> None:
    result = filterforward("demo", "--frames", "300", "--steps", "80", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    # The demo trains what `filterforward train` does by default: both candidates cross-validated, one kept.
    assert "candidate full_frame on tap mid: held-out event F1" in result.stdout
    assert "candidate full_frame on tap late: held-out event F1" in result.stdout
    assert "expected on new footage (cross-validation" in result.stdout
    assert "4/4 scoring the held-out frames 180:300" in result.stdout and "whole stream, H.264" in result.stdout
    spec = json.loads((tmp_path / "filters" / "spec.json").read_text())
    assert spec["architecture"] == "full_frame" and spec["validation"] is not None
    assert (tmp_path / "filters" / "model.onnx").is_file()
    assert (tmp_path / "edge" / "events.jsonl").is_file()


def test_the_demo_s_event_table_says_which_part_of_the_clip_each_lies_in(tmp_path: Path) -> None:
    """An event from frame 181 to 237 with the split at 226 was listed as held-out."""
    from filterforward.commands.demo import format_events

    events = [(10, 40), (181, 237), (250, 260)]
    lines = [{"type": "event_start", "id": "x"}] + [
        {"type": "event_end", "id": f"cam/f/{a}", "start_frame": a, "end_frame": b, "start_time": a / 10,
         "end_time": b / 10, "peak_score": 0.9}
        for a, b in events
    ]  # fmt: skip
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = format_events(tmp_path / "events.jsonl", 10.0, split=226).splitlines()
    assert [line.split()[-1] for line in table] == ["part", "train", "both", "held-out"]
