"""The edge node's YAML configuration, validated strictly at load time."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class EdgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    edge_id: str = Field("edge-1", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    base_model: Path | None = Field(None, description="ONNX base model with named taps (default EfficientNet-Lite0)")
    input_size: tuple[int, int] = Field((768, 448), description="base-DNN input (width, height), multiples of 32")
    threads: int | None = Field(None, ge=1, description="ONNX Runtime threads for the base DNN")
    cameras: list[CameraConfig] = Field(min_length=1)
    filters: list[Path] = Field(default_factory=list, description="filter bundle folders to load at start")
    sink: SinkConfig = SinkConfig()
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
        }
    )
