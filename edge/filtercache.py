"""The cloud's filters as this edge last ran them, kept on disk beside the spool, so that an edge that starts while
the cloud is unreachable (a power cut during an outage) filters with them, and spools its matches, instead of
matching nothing until the cloud is back; the cloud's snapshot replaces them once it answers (edge.filtersync).

Each model is stored under its SHA-256 (an unchanged filter is not written again); index.json, written last and
atomically, lists the specs and their models' digests, so a save cut short leaves the previous set whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from common.files import write_atomically
from models.filterspec import FilterSpec

log = logging.getLogger(__name__)

INDEX = "index.json"
MODEL_SUFFIX = ".onnx"


class FilterCache:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def load(self) -> list[tuple[FilterSpec, bytes]]:
        """The filters last saved (none before the first save); an entry whose model is missing or altered is
        skipped with a warning, as is an unreadable index."""
        try:
            index = json.loads((self.folder / INDEX).read_text())
            entries = [(FilterSpec.model_validate(entry["spec"]), str(entry["model"])) for entry in index["filters"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
            log.warning("the filters kept from the cloud (%s) cannot be read, so none are used: %s", self.folder, exc)
            return []
        filters = []
        for spec, digest in entries:
            try:
                onnx = (self.folder / f"{digest}{MODEL_SUFFIX}").read_bytes()
            except OSError as exc:
                log.warning("filter %s kept from the cloud has no model (%s); not used", spec.name, exc)
                continue
            if hashlib.sha256(onnx).hexdigest() != digest:
                log.warning("filter %s kept from the cloud has an altered model; not used", spec.name)
                continue
            filters.append((spec, onnx))
        log.info("filters kept from the cloud's version %s (saved %s): %s", index.get("version"),
                 index.get("saved_at"), sorted(spec.name for spec, _ in filters) or "none")  # fmt: skip
        return filters

    def save(self, version: int, filters: Iterable[tuple[FilterSpec, bytes]]) -> None:
        """Keep these filters in place of the last set; a failure (a full disk) is logged and leaves that set."""
        try:
            entries = []
            for spec, onnx in filters:
                digest = hashlib.sha256(onnx).hexdigest()
                model = self.folder / f"{digest}{MODEL_SUFFIX}"
                if not model.is_file():
                    write_atomically(model, onnx)
                entries.append({"spec": spec.model_dump(mode="json"), "model": digest})
            index = {"version": version, "saved_at": datetime.now(UTC).isoformat(), "filters": entries}
            write_atomically(self.folder / INDEX, json.dumps(index).encode())
            kept = {f"{entry['model']}{MODEL_SUFFIX}" for entry in entries}
            for stale in self.folder.glob(f"*{MODEL_SUFFIX}"):
                if stale.name not in kept:
                    stale.unlink(missing_ok=True)
        except OSError as exc:
            log.warning(
                "could not keep the cloud's filters on disk (%s): %s; the last set kept stays", self.folder, exc
            )
