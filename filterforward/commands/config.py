"""`filterforward config`: print the JSON schema of the edge and cloud YAML files, and check a file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from models.errors import FilterForwardError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from edge.config import EdgeConfig

KINDS = ("edge", "cloud")
_MARKERS = {"cameras": "edge", "tokens": "cloud"}  # a required top-level key only that kind of file has


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="print the config files' JSON schema or check a config file")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    schema = actions.add_parser(
        "schema",
        help="print the JSON schema of the edge or cloud YAML file",
        description="Prints the JSON schema (draft 2020-12) of an edge or cloud config file: every key, its type, "
        "default and meaning. Editors that understand YAML schemas can use it for completion and checks.",
    )
    schema.add_argument("kind", choices=KINDS, help="which file")
    schema.set_defaults(func=_schema)
    check = actions.add_parser(
        "check",
        help="validate a config file without starting anything",
        description="Validates FILE exactly as `filterforward edge run` or `cloud serve` would (with ${ENV} "
        "substituted from this environment) and prints `ok: ...`, or the first problem with its line and exits 2.",
    )
    check.add_argument("file", type=Path, metavar="FILE", help="an edge or cloud YAML file")
    check.add_argument("--kind", choices=KINDS, help="edge or cloud (default: edge with cameras:, cloud with tokens:)")
    check.set_defaults(func=_check)


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(_model(args.kind).model_json_schema(), indent=2))
    return 0


def _check(args: argparse.Namespace) -> int:
    kind = args.kind or detect_kind(args.file)
    print(f"ok: {args.file} is a valid {kind} config: {_summary(kind, args.file)}")
    return 0


def detect_kind(path: Path) -> str:
    """edge or cloud, from the file's top-level keys."""
    from common.configfile import parse_config

    kinds = {kind for key, kind in _MARKERS.items() if key in parse_config(path).data}
    if len(kinds) != 1:
        found = "both cameras: and tokens:" if kinds else "neither cameras: nor tokens:"
        raise FilterForwardError(f"config file {path} has {found}, so its kind is unclear; pass --kind edge|cloud")
    return kinds.pop()


def _model(kind: str) -> type[BaseModel]:
    if kind == "edge":
        from edge.config import EdgeConfig

        return EdgeConfig
    from cloud.config import CloudConfig

    return CloudConfig


def _check_edge_files(edge: EdgeConfig) -> None:
    """What `edge run` refuses at start besides the file itself: a camera source that is not there, a filter bundle
    that does not load or was trained at another input size. (The base model's identity needs the model exported:
    `edge run` checks that.)"""
    from edge.mcbank import check_input_size
    from edge.sources import check_source
    from models.bundle import load_bundles

    for camera in edge.cameras:
        try:
            check_source(camera.source)
        except FilterForwardError as exc:
            raise FilterForwardError(f"camera {camera.name}: {exc}") from None
    for spec, _ in load_bundles(edge.filters):
        check_input_size(spec, edge.input_size)


def _summary(kind: str, path: Path) -> str:
    """What the file sets up, in one line (no secrets)."""
    if kind == "edge":
        from edge.config import load_edge_config

        edge = load_edge_config(path)
        if edge.cloud:
            edge.cloud.check_keys()
        _check_edge_files(edge)
        output = f"cloud {edge.cloud.endpoint(edge.cloud.ingest_port)}" if edge.cloud else f"sink {edge.sink.path}"
        metrics = f", metrics on port {edge.metrics_port}" if edge.metrics_port is not None else ""
        cameras = ", ".join(cam.name for cam in edge.cameras)
        return f"edge {edge.edge_id}, {len(edge.cameras)} camera(s) ({cameras}), {output}{metrics}"
    from cloud.config import load_cloud_config

    cloud = load_cloud_config(path)
    cloud.zmq.check_keys()
    return (
        f"HTTP on {cloud.host}:{cloud.port}, ingest port {cloud.zmq.ingest_port}, filter port "
        f"{cloud.zmq.publish_port}, {len(cloud.tokens)} token(s)"
    )
