"""The edge node's YAML configuration, validated strictly at load time."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from common import curve
from common.configfile import ConfigPath, FolderPath, read_config, resolve
from common.endpoints import ipv6_literal, tcp_endpoint
from common.protocol import ID_PATTERN
from edge.stream_encoder import FRAGMENT_SECONDS, KEYFRAME_INTERVAL
from models.mc_kinds import MCWeights
from models.taps import check_input_size

Dimension = Annotated[int, Field(gt=0, le=16384)]


class UploadSettings(BaseModel):
    """How a camera's matched frames are encoded for filters whose encoding is `stream` (one H.264 stream per
    camera, shared by its filters: a frame several filters match is sent once)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    crf: int = Field(23, ge=0, le=51, description="x264 quality: lower is better and larger")
    bitrate_cap: int | None = Field(None, ge=10_000, description="peak bit/s (VBV); default uncapped")
    preset: Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow"] | None = Field(
        None,
        description="x264 speed/size trade-off; default medium, and fast above 720p (as small at the same quality, "
        "30% less CPU); a slower box can take veryfast",
    )
    keyframe_interval: float = Field(
        KEYFRAME_INTERVAL, gt=0, le=600, description="seconds between keyframes inside an event"
    )
    fragment_seconds: float = Field(
        FRAGMENT_SECONDS, ge=0.1, le=10, description="a fragment is sent once it spans this"
    )
    scale: float = Field(1.0, gt=0, le=1, description="upload size as a fraction of the decoded frame's (or crop's)")
    crop: Literal["none", "roi"] = Field(
        "none",
        description="roi: send only the box around the union of the camera's stream filters' ROIs (a new box "
        "starts a new GOP); none: the whole frame",
    )


class GateSettings(BaseModel):
    """The change gate (edge/change_gate.py): a frame that barely differs from the last frame the base DNN ran on,
    inside the camera's filters' regions, reuses that frame's scores (not on a camera with a windowed filter)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="false: the base DNN runs on every frame")
    pixel_delta: int = Field(12, ge=1, le=255, description="gray levels a pixel must move to count as changed")
    changed_fraction: float = Field(
        0.002, ge=0, le=1, description="a frame with fewer changed pixels (fraction of the regions) is skipped"
    )
    max_skipped: int = Field(25, ge=0, le=100_000, description="frames skipped in a row at most")


class CameraSettings(BaseModel):
    """What a camera may set itself or inherit from `defaults`."""

    model_config = ConfigDict(extra="forbid")

    pacing: Literal["realtime", "every-frame"] = Field(
        "realtime", description="realtime (drops the oldest frames when behind) or every-frame (never drops)"
    )
    fps: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="live cameras: their frame rate (default: measured in their first seconds) and a cap on processed "
        "frames/s; recordings: the rate they play at",
    )
    resolution: tuple[Dimension, Dimension] | None = Field(
        None, description="decode output (width, height): frames are resized to it; default the camera's own size"
    )
    buffer_frames: int = Field(
        8,
        ge=1,
        le=250,
        description="decoded frames queued ahead of the base DNN (8: 0.64 s at 12.5 fps): a camera rides out a "
        "slow frame or a burst without dropping; realtime pacing drops the oldest beyond them",
    )
    upload: UploadSettings = Field(default_factory=UploadSettings, description="the matched-frame H.264 stream")
    change_gate: GateSettings = Field(
        default_factory=GateSettings, description="skip the base DNN on frames that barely changed"
    )


class CameraDefaults(CameraSettings):
    """Settings every camera inherits unless it sets its own."""


class CameraConfig(CameraSettings):
    """A camera; the settings it leaves out come from `defaults`."""

    name: str = Field(pattern=ID_PATTERN)
    source: str = Field(min_length=1, description="video file, image folder, dataset folder, rtsp/http URL or device")

    @field_validator("source", mode="before")
    @classmethod
    def _device_number(cls, source: object) -> object:
        """`source: 0` (a device, as the example file's comment shows) is YAML's integer 0, not the text."""
        return str(source) if isinstance(source, int) and not isinstance(source, bool) and source >= 0 else source

    @field_validator("source")
    @classmethod
    def _relative_to_file(cls, source: str, info: ValidationInfo) -> str:
        base = (info.context or {}).get("base")
        is_path = "://" not in source and not source.isdigit() and not source.startswith("/dev/")
        return str(resolve(Path(source), base)) if base is not None and is_path else source

    def with_defaults(self, defaults: CameraDefaults) -> CameraConfig:
        """This camera with every setting it leaves out taken from `defaults`."""
        inherited = {
            key: getattr(defaults, key) for key in CameraSettings.model_fields if key not in self.model_fields_set
        }
        return self.model_copy(update=inherited)


class SinkConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: FolderPath = Field(
        Path("filterforward-out"), validate_default=True, description="folder for matched frames, clips, events.jsonl"
    )


class CloudLink(BaseModel):
    """The ZeroMQ link to the cloud: its ingest ROUTER (uplink) and filter PUB, with CURVE unless insecure."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(min_length=1, description="the cloud's host name or IP address (IPv4 or IPv6)")
    ingest_port: int = Field(5555, ge=1, le=65535)
    publish_port: int = Field(5556, ge=1, le=65535)
    server_key: ConfigPath | None = Field(None, description="the cloud's PUBLIC key file (filterforward keys)")
    secret_key: ConfigPath | None = Field(None, description="this edge's .key_secret file (its public half inside)")
    insecure: bool = Field(False, description="no CURVE: only for loopback tests and demos; the cloud must match")
    window: int = Field(64, ge=1, le=10000, description="credit: max unacknowledged messages in flight")
    heartbeat: float = Field(1.0, ge=0.05, le=60, description="seconds between heartbeats")
    timeout: float = Field(
        5.0, gt=0, le=3600, description="the cloud is shown unreachable after this many silent seconds"
    )

    @field_validator("address")
    @classmethod
    def _host_only(cls, address: str) -> str:
        """The endpoints are built from it (tcp://ADDRESS:PORT): a URL or host:port would make no address. An IPv6
        address is kept bare (::1, with or without brackets)."""
        if (literal := ipv6_literal(address)) is not None:
            return literal
        if "/" in address or ":" in address:
            raise ValueError(
                f"{address!r} is not a host: give the cloud's host name or IP address alone (e.g. cloud.example); "
                "the ports are ingest_port and publish_port"
            )
        return address

    @model_validator(mode="after")
    def _keys_or_insecure(self) -> CloudLink:
        if not self.insecure and (self.server_key is None or self.secret_key is None):
            raise ValueError(
                "set cloud.server_key and cloud.secret_key (create them with `filterforward keys create`), "
                "or cloud.insecure: true for a loopback test"
            )
        if self.ingest_port == self.publish_port:
            raise ValueError(f"ingest_port and publish_port are both {self.ingest_port}; use the cloud's two ports")
        return self

    def check_keys(self) -> None:
        """The key files read as what they are set as (one line when not): at start, and in `config check`."""
        if not self.insecure:
            curve.load_keypair(self.secret_key)
            curve.load_server_public(self.server_key)

    def endpoint(self, port: int) -> str:
        return tcp_endpoint(self.address, port)


class SpoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: FolderPath = Field(
        Path("spool"),
        validate_default=True,
        description="the edge's state: the uplink's message spool (a SQLite file), the cloud's filters as last "
        "received, footage the cloud asked for",
    )
    max_bytes: int = Field(2**30, gt=0, description="over this the spool drops its oldest messages")


class EdgeConfig(BaseModel):
    """After validation every camera holds its effective settings (its own, else `defaults`)."""

    model_config = ConfigDict(extra="forbid")

    edge_id: str = Field("edge-1", pattern=ID_PATTERN)
    base_model: ConfigPath | None = Field(
        None,
        description="ONNX base model with named taps (default EfficientNet-Lite0 fp32); `filterforward models export "
        "--precision int8|bf16` writes faster ones, and filters must be trained on the same file",
    )
    input_size: tuple[int, int] = Field((768, 448), description="base-DNN input (width, height), multiples of 32")
    threads: int | None = Field(None, ge=1, description="threads for the base DNN (ONNX Runtime or OpenVINO)")
    mc_weights: MCWeights = Field(
        "fp32",
        description="int8: the fully connected layers of the fused MC graphs run with int8 weights (localized and "
        "windowed MC banks 1.3-1.5x cheaper, the same event F1 where measured); fp32: as trained",
    )
    defaults: CameraDefaults = Field(
        default_factory=CameraDefaults, description="camera settings every camera inherits unless it sets its own"
    )
    cameras: list[CameraConfig] = Field(min_length=1)
    filters: list[ConfigPath] = Field(default_factory=list, description="filter bundle folders to load at start")
    # built from {} at validation so that their default folders, too, are relative to the file
    sink: SinkConfig = Field(default_factory=dict, validate_default=True, description="where matched frames go")
    cloud: CloudLink | None = Field(None, description="send to the cloud instead of the sink folder")
    spool: SpoolConfig = Field(default_factory=dict, validate_default=True, description="the uplink's spool")
    stats_interval: float = Field(10.0, gt=0, le=86_400, description="seconds between stats log lines")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve Prometheus metrics at http://0.0.0.0:PORT/metrics (0: a free port)"
    )

    @field_validator("input_size")
    @classmethod
    def _multiple_of_stride(cls, value: tuple[int, int]) -> tuple[int, int]:
        return check_input_size(value)

    @field_validator("cameras")
    @classmethod
    def _unique_names(cls, cameras: list[CameraConfig]) -> list[CameraConfig]:
        twice = [name for name, count in Counter(cam.name for cam in cameras).items() if count > 1]
        if twice:
            raise ValueError(f"camera name {twice[0]!r} is used more than once; give each camera its own name")
        return cameras

    @model_validator(mode="after")
    def _inherit_defaults(self) -> EdgeConfig:
        self.cameras = [cam.with_defaults(self.defaults) for cam in self.cameras]
        return self


def load_edge_config(path: Path) -> EdgeConfig:
    """Read and validate an edge YAML file; relative paths in it are relative to the file."""
    return read_config(path, EdgeConfig)
