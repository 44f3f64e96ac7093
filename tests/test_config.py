"""Edge and cloud YAML configuration: strict keys with their line numbers, ${ENV}, camera defaults, the
`filterforward config` command, and the example files."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest

from cloud.config import load_cloud_config
from common.curve import create_keypair
from edge.config import CameraConfig, EdgeConfig, SinkConfig, load_edge_config
from edge.node import EdgeNode
from edge.sources import open_source
from filterforward.cli import main
from models.errors import FilterForwardError

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
EDGE = """\
edge_id: edge-7
defaults:
  pacing: every-frame
  fps: 8
  resolution: [64, 48]
cameras:
  - name: gate
    source: gate.mp4
  - name: yard
    source: rtsp://cam.example/yard
    pacing: realtime
    fps: null
    resolution: [32, 24]
"""


def write(tmp_path: Path, text: str, name: str = "edge.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def edge_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(FilterForwardError) as caught:
        load_edge_config(write(tmp_path, text))
    return str(caught.value)


def test_cameras_inherit_the_defaults_unless_they_set_their_own(tmp_path: Path) -> None:
    config = load_edge_config(write(tmp_path, EDGE))
    gate, yard = config.cameras
    assert (gate.pacing, gate.fps, gate.resolution) == ("every-frame", 8.0, (64, 48))
    assert (yard.pacing, yard.fps, yard.resolution) == ("realtime", None, (32, 24))  # null overrides too
    assert gate.source == str(tmp_path / "gate.mp4") and yard.source == "rtsp://cam.example/yard"
    assert config.sink.path == tmp_path / "filterforward-out" and config.spool.path == tmp_path / "spool"
    assert config.metrics_port is None and config.stats_interval == 10.0


def test_without_defaults_cameras_get_the_built_in_settings(tmp_path: Path) -> None:
    config = load_edge_config(write(tmp_path, "cameras: [{name: gate, source: '0'}]\nmetrics_port: 9101\n"))
    camera = config.cameras[0]
    assert (camera.pacing, camera.fps, camera.resolution, camera.buffer_frames) == ("realtime", None, None, 8)
    assert config.metrics_port == 9101


def test_an_unknown_top_level_key_names_itself_and_its_line(tmp_path: Path) -> None:
    message = edge_error(tmp_path, EDGE + "stats_intervall: 5\n")
    path = tmp_path / "edge.yaml"
    expected = f"config file {path}, line 14: stats_intervall: unknown key (did you mean stats_interval?); the keys"
    assert message.startswith(expected)
    assert "stats_interval" in message and "\n" not in message


def test_an_unknown_nested_key_names_its_path_and_line(tmp_path: Path) -> None:
    message = edge_error(tmp_path, EDGE.replace("    fps: null\n", "    fps: null\n    resolutoin: [1, 1]\n"))
    assert ", line 13: cameras.1.resolutoin: unknown key (did you mean resolution?); the keys allowed here" in message
    message = edge_error(tmp_path, EDGE + "cloud:\n  address: cloud.example\n  insecure: true\n  windo: 3\n")
    assert ", line 17: cloud.windo: unknown key (did you mean window?); the keys allowed here are: address," in message
    message = edge_error(tmp_path, EDGE.replace("  fps: 8\n", "  fps: 8\n  source: x\n"))
    assert ", line 5: defaults.source: unknown key" in message


def test_a_wrong_type_points_at_its_line(tmp_path: Path) -> None:
    message = edge_error(tmp_path, EDGE.replace("fps: 8", "fps: fast"))
    assert ", line 4: defaults.fps: Input should be a valid number" in message
    message = edge_error(tmp_path, EDGE.replace("[32, 24]", "[32, 0]"))
    assert ", line 13: cameras.1.resolution.1: Input should be greater than 0" in message
    message = edge_error(tmp_path, EDGE.replace("    fps: null\n", "    buffer_frames: 0\n"))
    assert ", line 12: cameras.1.buffer_frames: Input should be greater than or equal to 1" in message
    message = edge_error(tmp_path, EDGE.replace("    source: gate.mp4\n", ""))
    assert ", line 7: cameras.0.source: required key is missing; add it" in message
    message = edge_error(tmp_path, EDGE + "mc_weights: int4\n")
    assert ", line 14: mc_weights: Input should be 'fp32' or 'int8'" in message


@pytest.mark.parametrize(
    ("setting", "message"),
    [  # each once accepted, then crashed a thread (a poll timeout overflowed), spun, or failed far from the file
        ("cloud: {address: c, insecure: true, heartbeat: .inf}", "cloud.heartbeat: Input should be less than"),
        ("cloud: {address: c, insecure: true, heartbeat: 1e-9}", "cloud.heartbeat: Input should be greater than"),
        ("cloud: {address: c, insecure: true, timeout: .nan}", "cloud.timeout: Input should be less than or equal"),
        ("stats_interval: .inf", "stats_interval: Input should be less than or equal to 86400"),
        ("defaults: {fps: .inf}", "defaults.fps: Input should be less than or equal to 1000"),
    ],
)
def test_numbers_out_of_any_sensible_range_are_refused_at_load(tmp_path: Path, setting: str, message: str) -> None:
    text = EDGE.replace("defaults:\n  pacing: every-frame\n  fps: 8\n  resolution: [64, 48]\n", "") + setting + "\n"
    error = edge_error(tmp_path, text)
    assert f", line 10: {message}" in error and "\n" not in error, error  # the setting's line


def test_true_or_false_is_no_number(tmp_path: Path) -> None:
    """pydantic's lax mode read `resolution: [true, true]` as 1x1 pixels (the edge then ran on them), `fps: true` as
    1 frame/s and the cloud's `port: true` as port 1."""
    message = edge_error(tmp_path, EDGE.replace("[32, 24]", "[true, true]"))
    assert message.endswith(", line 13: cameras.1.resolution.0: should be a number, not true or false")
    message = edge_error(tmp_path, EDGE.replace("fps: 8", "fps: yes"))  # YAML 1.1's yes is true
    assert message.endswith(", line 4: defaults.fps: should be a number, not true or false")
    message = edge_error(tmp_path, EDGE + "metrics_port: false\n")
    assert message.endswith(", line 14: metrics_port: should be a number, not true or false")
    edge = load_edge_config(write(tmp_path, EDGE + "cloud: {address: c, insecure: true}\n"))
    assert edge.cloud is not None and edge.cloud.insecure is True  # a true where one belongs
    cloud = write(
        tmp_path, "tokens: [{name: ops, token: '%s'}]\nzmq: {insecure: true}\nport: true\n" % ("x" * 20), "cloud.yaml"
    )
    with pytest.raises(FilterForwardError, match=r", line 3: port: should be a number, not true or false$"):
        load_cloud_config(cloud)


@pytest.mark.parametrize("token", ["spacey-token-0123456789 ", "ünïcode-token-0123456789", "tab\tin-the-token-01234"])
def test_a_token_no_request_could_carry_is_refused(tmp_path: Path, token: str) -> None:
    """They passed the check, then every request with them got 401 "unknown token"."""
    cloud = write(tmp_path, f"tokens: [{{name: ops, token: {json.dumps(token)}}}]\nzmq: {{insecure: true}}\n", "c.yaml")
    with pytest.raises(FilterForwardError, match=r", line 1: tokens.0.token: a token can only hold printable ASCII"):
        load_cloud_config(cloud)


def test_a_device_number_needs_no_quotes(tmp_path: Path) -> None:
    config = load_edge_config(write(tmp_path, EDGE.replace("source: gate.mp4", "source: 0")))
    assert config.cameras[0].source == "0"  # a device, not a file named 0 beside the config
    assert "Input should be a valid string" in edge_error(tmp_path, EDGE.replace("source: gate.mp4", "source: 1.5"))


def test_load_time_checks_say_what_is_wrong(tmp_path: Path) -> None:
    message = edge_error(tmp_path, EDGE.replace("name: yard", "name: gate"))
    assert ", line 6: cameras: camera name 'gate' is used more than once" in message
    (tmp_path / "spool-file").write_text("not a folder")
    message = edge_error(tmp_path, EDGE + "spool:\n  path: spool-file\n")
    assert f", line 15: spool.path: {tmp_path / 'spool-file'} is a file; point it at a folder" in message
    message = edge_error(tmp_path, EDGE + "edge_id: again\n")
    assert ", line 14: edge_id: given twice (first on line 1); keep one" in message
    assert ", line 3: the file is not valid YAML" in edge_error(tmp_path, "cameras:\n  - [unclosed\n")


def test_env_substitution_names_the_missing_variable_and_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FF_TEST_CAMERA_HOST", raising=False)
    text = EDGE.replace("cam.example", "${FF_TEST_CAMERA_HOST}") + "# ${FF_TEST_ONLY_IN_A_COMMENT}\n"
    message = edge_error(tmp_path, text)
    assert ", line 10: cameras.1.source: uses ${FF_TEST_CAMERA_HOST} but the environment has no" in message
    monkeypatch.setenv("FF_TEST_CAMERA_HOST", "10.0.0.9")
    assert load_edge_config(tmp_path / "edge.yaml").cameras[1].source == "rtsp://10.0.0.9/yard"
    defaulted = EDGE.replace("edge-7", "${FF_TEST_EDGE_ID:-edge-9}")
    assert load_edge_config(write(tmp_path, defaulted)).edge_id == "edge-9"


def test_the_configured_resolution_is_what_frames_come_out_at(tmp_path: Path) -> None:
    video = tmp_path / "gate.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (96, 64))
    for index in range(6):
        writer.write(np.full((64, 96, 3), index * 40, np.uint8))
    writer.release()
    gate = load_edge_config(write(tmp_path, EDGE)).cameras[0]
    with open_source(gate.source, pacing=gate.pacing, fps=gate.fps, resolution=gate.resolution) as source:
        frames = list(source)
        assert source.frame_size == (64, 48)
    assert len(frames) == 6 and all(frame.image.shape == (48, 64, 3) for frame in frames)


def test_each_camera_queues_the_frames_its_buffer_allows(short_clip: Path, base_model: Path, tmp_path: Path) -> None:
    config = EdgeConfig(
        base_model=base_model,
        input_size=(128, 96),
        cameras=[
            CameraConfig(name="gate", source=str(short_clip), pacing="every-frame"),
            CameraConfig(name="yard", source=str(short_clip), pacing="every-frame", buffer_frames=3),
        ],
        sink=SinkConfig(path=tmp_path / "out"),
    )
    node = EdgeNode(config)
    node.run()  # to the end of both clips
    assert {name: source.queue_size for name, source in node.sources.items()} == {"gate": 8, "yard": 3}


def test_config_schema_prints_the_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema", "edge"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"cameras", "defaults", "metrics_port", "spool"} <= set(schema["properties"])
    assert main(["config", "schema", "cloud"]) == 0
    assert "tokens" in json.loads(capsys.readouterr().out)["properties"]


def test_config_check_reports_ok_or_the_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    edge = write(tmp_path, EDGE)
    # What `edge run` refuses at start is not "ok" either: a camera file that is not there, a filter that is not.
    assert main(["config", "check", str(edge)]) == 2
    assert f"camera gate: source {tmp_path / 'gate.mp4'} does not exist" in capsys.readouterr().err
    (tmp_path / "gate.mp4").touch()
    unfiltered = write(tmp_path, EDGE + "filters: [runs/nothing]\n", "unfiltered.yaml")
    assert main(["config", "check", str(unfiltered)]) == 2
    assert f"filter bundle {tmp_path / 'runs' / 'nothing'} is not a folder" in capsys.readouterr().err
    assert main(["config", "check", str(edge)]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {edge} is a valid edge config: edge edge-7, 2 camera(s)")

    bad = write(tmp_path, EDGE + "cloud: {address: x, insecure: true, ingest_port: 0}\n", "bad.yaml")
    assert main(["config", "check", str(bad), "--kind", "edge"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith("line 14: cloud.ingest_port: Input should be greater than or equal to 1")

    monkeypatch.setenv("FF_TEST_TOKEN", "x" * 20)
    cloud = write(tmp_path, "tokens: [{name: ops, token: '${FF_TEST_TOKEN}'}]\nzmq: {insecure: true}\n", "cloud.yaml")
    assert main(["config", "check", str(cloud)]) == 0
    assert "valid cloud config: HTTP on 127.0.0.1:8000" in capsys.readouterr().out
    assert main(["config", "check", str(cloud), "--kind", "edge"]) == 2
    assert "cameras: required key is missing" in capsys.readouterr().err
    # A model limit above what edges load (models.bundle) would accept filters no edge can run.
    big = write(tmp_path, "tokens: [{name: ops, token: '${FF_TEST_TOKEN}'}]\nzmq: {insecure: true}\n"
                "max_upload_bytes: 67108864\n", "big.yaml")  # fmt: skip
    assert main(["config", "check", str(big)]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("line 3: max_upload_bytes: Input should be less than or equal to 16777216")
    )

    # The key files are read as `edge run` and `cloud serve` read them: a config that cannot start is not "ok".
    create_keypair(tmp_path / "keys", "cloud")
    create_keypair(tmp_path / "keys", "edge-7")
    for server_key, message in [
        ("keys/nope.key", f"key file {tmp_path / 'keys' / 'nope.key'} does not exist"),
        ("keys/cloud.key_secret", "holds a secret key: give the public .key file"),
    ]:
        link = f"cloud: {{address: x, server_key: {server_key}, secret_key: keys/edge-7.key_secret}}\n"
        keyed = write(tmp_path, EDGE + link, "keyed.yaml")
        assert main(["config", "check", str(keyed)]) == 2
        assert message in capsys.readouterr().err
    link = "cloud: {address: x, server_key: keys/cloud.key, secret_key: keys/edge-7.key_secret}\n"
    keyed = write(tmp_path, EDGE + link, "keyed.yaml")
    assert main(["config", "check", str(keyed)]) == 0
    capsys.readouterr()
    served = write(tmp_path, "tokens: [{name: ops, token: '${FF_TEST_TOKEN}'}]\n"
                   "zmq: {secret_key: keys/cloud.key, edge_keys: keys}\n", "served.yaml")  # fmt: skip
    assert main(["config", "check", str(served)]) == 2
    assert "holds no secret key: give the .key_secret file" in capsys.readouterr().err

    neither = write(tmp_path, "edge_id: x\n", "neither.yaml")
    assert main(["config", "check", str(neither)]) == 2
    assert "neither cameras: nor tokens:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "is a folder: give the YAML file in it"),
        (b"edge_id: caf\xe9\n", "is not UTF-8 text (byte 12): save it as UTF-8 YAML"),
    ],
)
def test_a_config_that_is_no_text_file_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    path = tmp_path / "edge.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(["config", "check", str(path), "--kind", "edge"]) == 2
    error = capsys.readouterr().err
    assert error == f"filterforward config: error: config file {path} {message}\n"


def test_the_example_files_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    edge = load_edge_config(DEPLOY / "edge.example.yaml")
    parking = edge.cameras[0]
    assert (parking.pacing, parking.fps, parking.resolution) == ("realtime", None, None)  # overrides the defaults
    assert edge.defaults.fps == 10 and edge.defaults.resolution == (1280, 720) and edge.metrics_port == 9101

    monkeypatch.setenv("FF_OPERATOR_TOKEN", "o" * 32)
    monkeypatch.setenv("FF_DASHBOARD_TOKEN", "d" * 32)
    cloud = load_cloud_config(DEPLOY / "cloud.example.yaml")
    assert [token.token for token in cloud.tokens] == ["o" * 32, "d" * 32]
    assert cloud.zmq.edge_keys.resolve() == DEPLOY.parent / "keys" / "edges"


def test_upload_crop_is_checked_at_load(tmp_path: Path) -> None:
    config = load_edge_config(
        write(tmp_path, EDGE.replace("  fps: 8\n", "  fps: 8\n  upload: {crop: roi, scale: 0.5}\n"))
    )
    assert [(c.upload.crop, c.upload.scale) for c in config.cameras] == [("roi", 0.5), ("roi", 0.5)]
    message = edge_error(tmp_path, EDGE.replace("  fps: 8\n", "  fps: 8\n  upload: {crop: box}\n"))
    assert ", line 5: defaults.upload.crop: Input should be 'none' or 'roi'" in message and "\n" not in message


def test_an_ended_camera_s_stats_line_is_logged_once_not_every_interval(
    short_clip: Path, base_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A camera whose recording ended logged the same zeros every stats_interval while another camera ran on."""
    config = EdgeConfig(
        base_model=base_model,
        input_size=(128, 96),
        cameras=[
            CameraConfig(name="gate", source=str(short_clip), pacing="every-frame"),  # ends within a second
            CameraConfig(name="yard", source=str(short_clip), pacing="realtime"),  # 40 frames at 12 fps: 3.3 s
        ],
        sink=SinkConfig(path=tmp_path / "out"),
        stats_interval=0.2,
    )
    with caplog.at_level(logging.INFO, logger="edge.node"):
        EdgeNode(config).run()
    lines = [record.getMessage() for record in caplog.records if record.name == "edge.node"]
    yard = [line for line in lines if line.startswith("camera yard:")]
    gate = [line for line in lines if line.startswith("camera gate:")]
    assert len(yard) >= 5  # the intervals while yard ran
    assert 1 <= sum(line.endswith("(ended)") for line in gate) <= 2  # when it ended, and in the final lines
