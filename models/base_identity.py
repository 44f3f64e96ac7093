"""Which base model an ONNX file is: its name, numeric precision and the digest of the file itself.

The exported EfficientNet-Lite0 carries neither name nor precision in its metadata: such a file is named by its
stem and taken as fp32. A reduced-precision export (models/base_precision.py) sets both. The digest is of the
bytes, so two exports match only if they are the same file (exports are deterministic: the same torch, weights
and calibration frames give the same bytes).
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx

from models.base_export import file_digest
from models.errors import FilterForwardError
from models.filterspec import BaseModelId

NAME_KEY = "filterforward.base_model"  # ONNX metadata_props keys a reduced-precision export sets
PRECISION_KEY = "filterforward.precision"


def identify(path: Path) -> BaseModelId:
    """The identity of the base model in the ONNX file at `path`."""
    try:
        props = metadata(path)
    except Exception as exc:  # protobuf's DecodeError and friends: not an ONNX file at all
        raise FilterForwardError(f"base model {path} does not load as an ONNX model: {exc}") from exc
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(path).stem).lstrip("_.-")[:64] or "base"
    return BaseModelId(
        name=props.get(NAME_KEY, stem), precision=props.get(PRECISION_KEY, "fp32"), digest=file_digest(path)
    )


def set_identity(model: onnx.ModelProto, name: str, precision: str, **extra: str) -> None:
    """Record a base model's name and precision (and `extra` keys under filterforward.*) in its metadata."""
    wanted = {NAME_KEY: name, PRECISION_KEY: precision} | {f"filterforward.{k}": v for k, v in extra.items()}
    onnx.helper.set_model_props(model, {p.key: p.value for p in model.metadata_props} | wanted)


def metadata(path: Path) -> dict[str, str]:
    """The metadata_props of the ONNX file at `path` (weights not loaded)."""
    return {prop.key: prop.value for prop in onnx.load(str(path), load_external_data=False).metadata_props}
