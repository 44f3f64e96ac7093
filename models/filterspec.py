"""The filter spec: the one contract between training, the edge's MC bank and the cloud's registry."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from models.mc_kinds import MC_KINDS
from models.roi import FULL_FRAME, ROI
from models.taps import PIXELS

# Fixed when this module loads, so that the JSON schema (and the cloud's OpenAPI) lists exactly the kinds.
Architecture = Literal[tuple(MC_KINDS)]
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # edge and camera ids (the edge config's names)
EVERY_CAMERA = "*"
EVENT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"  # an event is a labels.csv column: it names files and folders
CameraName = Annotated[str, Field(min_length=1, max_length=128)]
WarningText = Annotated[str, Field(max_length=2000)]
MAX_MOTION_FRAMES = 64
MAX_VERSION = 2**31 - 1  # fits every database's integer column; the registry refuses to bump past it


class Smoothing(BaseModel):
    """k-of-N voting: a frame is positive when at least k of the last n scores pass the threshold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(0.5, gt=0.0, lt=1.0, allow_inf_nan=False)
    k: int = Field(3, ge=1)
    n: int = Field(5, ge=1, le=256)

    @model_validator(mode="after")
    def _k_le_n(self) -> Smoothing:
        if self.k > self.n:
            raise ValueError(f"smoothing needs k <= n, got k={self.k}, n={self.n}")
        return self


class Encoding(BaseModel):
    """How matched frames leave the edge: by default in the camera's H.264 stream of matched frames (fragments of
    about a second, settings per camera: the fewest bits), or one JPEG per frame, or an H.264 clip per event (sent
    when it ends)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["stream", "jpeg", "clip"] = "stream"
    jpeg_quality: int = Field(80, ge=10, le=100, description="for kind jpeg")


class Validation(BaseModel):
    """What cross-validation over time on the training frames expects of the filter on footage it has not seen.

    Each fold held out whole occurrences of the event (or, with one occurrence or occurrences no fold could hold out
    whole, thirds of their frames: method "blocks") and was scored by a model trained without them, at the filter's
    threshold and k-of-n.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_f1: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="event F1 over all held-out frames")
    f1_min: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="the worst fold's event F1")
    f1_max: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="the best fold's event F1")
    precision: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    event_recall: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    folds: int = Field(ge=0, le=64)
    occurrences: int = Field(ge=0, description="separate occurrences of the event in the training frames")
    method: Literal["occurrences", "blocks"]
    warnings: tuple[WarningText, ...] = Field(
        (), max_length=16, description="why the estimate may not hold, and what to label"
    )


class MotionVeto(BaseModel):
    """A frame counts towards the k-of-n only if the region's share of moving pixels (models/motion.py) reached
    `min_foreground` in one of its last `frames` frames."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_foreground: float = Field(
        gt=0.0, le=1.0, allow_inf_nan=False, description="share of the region's pixels that moved"
    )
    frames: int = Field(5, ge=1, le=MAX_MOTION_FRAMES, description="frames back the motion may lie")


class BaseModelId(BaseModel):
    """The base model whose feature maps an MC reads (models/base_identity.py): an MC's scores mean nothing on
    another model's features, so the edge and the cloud refuse a filter whose base model differs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    precision: str = Field("fp32", pattern=r"^[a-z0-9]{1,16}$", description="fp32, bf16, int8, ...")
    digest: str = Field(pattern=r"^[0-9a-f]{16}$", description="the first 16 hex digits of its ONNX file's SHA-256")

    def __str__(self) -> str:
        return f"{self.name} {self.precision} (digest {self.digest})"


class TrainedOn(BaseModel):
    """Where a filter's training frames came from: scored there, it looks better than it will on new footage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(max_length=128, description="the dataset's name")
    frames: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] = Field(
        description="the training frames, start and stop (exclusive)"
    )


class FilterSpec(BaseModel):
    """Everything the edge needs to run one microclassifier, except its ONNX weights (stored beside it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    event: str = Field("", max_length=128, description="label column the MC was trained for (informational)")
    cameras: list[CameraName] = Field(default_factory=lambda: [EVERY_CAMERA], min_length=1, max_length=1024)
    architecture: Architecture
    tap: str = Field(min_length=1, max_length=64)
    roi: ROI = FULL_FRAME
    input_size: tuple[int, int] = Field(description="base-DNN input (width, height) the MC was trained at")
    smoothing: Smoothing = Smoothing()
    window: int = Field(5, ge=1, le=64, description="frames stacked by a windowed MC")
    encoding: Encoding = Encoding()
    version: int = Field(1, ge=1, le=MAX_VERSION)
    validation: Validation | None = Field(None, description="cross-validated estimate from training, if any")
    base_model: BaseModelId | None = Field(
        None, description="the base model it was trained on (taps and input size above); null: not recorded"
    )
    warnings: tuple[WarningText, ...] = Field(
        (), max_length=16, description="without a validation: why there is no estimate, and what to label"
    )
    motion: MotionVeto | None = Field(None, description="the motion the region needs for a frame to count; null: none")
    trained_on: TrainedOn | None = Field(None, description="its training frames; null: not recorded")

    @field_validator("cameras")
    @classmethod
    def _cameras_an_edge_can_have(cls, cameras: list[str], info: ValidationInfo) -> list[str]:
        """Input only (INPUT context): a name no edge's camera can have matched nothing, silently. Specs stored before
        this check keep loading."""
        if info.context and info.context.get("input"):
            for camera in cameras:
                if camera != EVERY_CAMERA and not re.match(ID_PATTERN, camera):
                    raise ValueError(
                        f"camera {camera!r} is no camera name an edge can have (letters, digits, '_', '.', '-', up to "
                        f"64; '{EVERY_CAMERA}' for every camera): use the name in the edge's config"
                    )
        if info.context and info.context.get("input") and (twice := _repeated(cameras)):
            raise ValueError(f"camera {twice!r} is listed twice: list each camera once")
        return cameras

    @field_validator("event")
    @classmethod
    def _event_a_dataset_can_have(cls, event: str, info: ValidationInfo) -> str:
        """Input only, as cameras: an event is a dataset's labels.csv column (the studio labels it by this name)."""
        if info.context and info.context.get("input") and event and not re.match(EVENT_PATTERN, event):
            raise ValueError(
                f"event {event!r} is no event name a dataset can have (a letter or '_', then letters, digits, '_', "
                "'.', '-', up to 64): use the labels.csv column the filter was trained for, or leave it empty"
            )
        return event

    @model_validator(mode="after")
    def _tap_of_its_kind(self, info: ValidationInfo) -> FilterSpec:
        """Input only: the edge reads pixels for a pixel kind (discrete) and a base-DNN tap for the others."""
        if (
            info.context
            and info.context.get("input")
            and MC_KINDS[self.architecture].reads_pixels != (self.tap == PIXELS)
        ):
            wanted = f"tap '{PIXELS}'" if MC_KINDS[self.architecture].reads_pixels else "a base-DNN tap"
            raise ValueError(f"a {self.architecture} MC reads {wanted}, not tap {self.tap!r}: fix the architecture")
        return self

    @model_validator(mode="after")
    def _one_place_for_warnings(self) -> FilterSpec:
        if self.warnings and self.validation is not None:
            raise ValueError("warnings go in validation.warnings when the filter has a validation")
        return self

    @property
    def caveats(self) -> tuple[str, ...]:
        """Why the filter may not hold on new footage: its validation's warnings, or why it has no validation."""
        return self.validation.warnings if self.validation else self.warnings

    def applies_to(self, camera: str) -> bool:
        return EVERY_CAMERA in self.cameras or camera in self.cameras


def _repeated(items: list[str]) -> str | None:
    """The first item listed a second time, None if none is."""
    seen: set[str] = set()
    return next((item for item in items if item in seen or seen.add(item)), None)
