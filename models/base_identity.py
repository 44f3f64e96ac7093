"""Which base model an ONNX file is: its name, numeric precision and the digest of the file itself.

The exported EfficientNet-Lite0 carries neither name nor precision in its metadata: such a file is named by its
stem and taken as fp32. The digest is of the bytes, so two exports match only if they are the same file (the
export is deterministic: the same torch and weights give the same bytes).
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx

from models.base_export import file_digest
from models.filterspec import BaseModelId

NAME_KEY = "filterforward.base_model"  # ONNX metadata_props keys a reduced-precision export sets
PRECISION_KEY = "filterforward.precision"


def identify(path: Path) -> BaseModelId:
    """The identity of the base model in the ONNX file at `path`."""
    metadata = {prop.key: prop.value for prop in onnx.load(str(path), load_external_data=False).metadata_props}
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(path).stem).lstrip("_.-")[:64] or "base"
    return BaseModelId(
        name=metadata.get(NAME_KEY, stem), precision=metadata.get(PRECISION_KEY, "fp32"), digest=file_digest(path)
    )
