"""The edge node's YAML configuration, validated strictly at load time."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edge.configfile import read_config, resolve
from models.taps import check_input_size


class CameraConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    source: str = Field(min_length=1, description="video file, image folder, dataset folder, rtsp/http URL or device")
    pacing: Literal["realtime", "every-frame"] = "realtime"
    fps: float | None = Field(None, gt=0, description="cap on processed frames per second")


class SinkConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Path = Field(Path("filterforward-out"), description="folder for matched frames, clips and events.jsonl")


class CloudLink(BaseModel):
    """The ZeroMQ link to the cloud: its ingest ROUTER (uplink) and filter PUB, with CURVE unless insecure."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(min_length=1, description="the cloud's host name or IP address")
    ingest_port: int = Field(5555, ge=1, le=65535)
    publish_port: int = Field(5556, ge=1, le=65535)
    server_key: Path | None = Field(None, description="the cloud's PUBLIC key file (filterforward keys)")
    secret_key: Path | None = Field(None, description="this edge's .key_secret file (its public half inside)")
    insecure: bool = Field(False, description="no CURVE: only for loopback tests and demos; the cloud must match")
    window: int = Field(64, ge=1, le=10000, description="credit: max unacknowledged messages in flight")
    heartbeat: float = Field(1.0, gt=0, description="seconds between heartbeats")
    timeout: float = Field(5.0, gt=0, description="the cloud is shown unreachable after this many silent seconds")

    @model_validator(mode="after")
    def _keys_or_insecure(self) -> CloudLink:
        if not self.insecure and (self.server_key is None or self.secret_key is None):
            raise ValueError(
                "set cloud.server_key and cloud.secret_key (create them with `filterforward keys create`), "
                "or cloud.insecure: true for a loopback test"
            )
        return self

    def endpoint(self, port: int) -> str:
        return f"tcp://{self.address}:{port}"


class SpoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Path = Field(Path("spool"), description="folder of the uplink's message spool (a SQLite file inside)")
    max_bytes: int = Field(2**30, gt=0, description="over this the spool drops its oldest messages")


class EdgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    edge_id: str = Field("edge-1", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    base_model: Path | None = Field(None, description="ONNX base model with named taps (default EfficientNet-Lite0)")
    input_size: tuple[int, int] = Field((768, 448), description="base-DNN input (width, height), multiples of 32")
    threads: int | None = Field(None, ge=1, description="ONNX Runtime threads for the base DNN")
    cameras: list[CameraConfig] = Field(min_length=1)
    filters: list[Path] = Field(default_factory=list, description="filter bundle folders to load at start")
    sink: SinkConfig = SinkConfig()
    cloud: CloudLink | None = Field(None, description="send to the cloud instead of the sink folder")
    spool: SpoolConfig = SpoolConfig()
    stats_interval: float = Field(10.0, gt=0, description="seconds between stats log lines")

    @field_validator("input_size")
    @classmethod
    def _multiple_of_stride(cls, value: tuple[int, int]) -> tuple[int, int]:
        return check_input_size(value)


def load_edge_config(path: Path) -> EdgeConfig:
    """Read and validate an edge YAML file; relative paths in it are relative to the file."""
    return _resolve_paths(read_config(path, EdgeConfig), Path(path).parent)


def _resolve_paths(config: EdgeConfig, base: Path) -> EdgeConfig:
    def resolve_source(source: str) -> str:
        is_path = "://" not in source and not source.isdigit() and not source.startswith("/dev/")
        return str(resolve(Path(source), base)) if is_path else source

    cameras = [cam.model_copy(update={"source": resolve_source(cam.source)}) for cam in config.cameras]
    return config.model_copy(
        update={
            "cameras": cameras,
            "filters": [resolve(p, base) for p in config.filters],
            "base_model": resolve(config.base_model, base) if config.base_model else None,
            "sink": SinkConfig(path=resolve(config.sink.path, base)),
            "cloud": _resolve_keys(config.cloud, base) if config.cloud else None,
            "spool": config.spool.model_copy(update={"path": resolve(config.spool.path, base)}),
        }
    )


def _resolve_keys(link: CloudLink, base: Path) -> CloudLink:
    keys = {name: resolve(getattr(link, name), base) for name in ("server_key", "secret_key") if getattr(link, name)}
    return link.model_copy(update=keys)
