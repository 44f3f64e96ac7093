"""`filterforward models`: export and inspect the base DNN."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="export or inspect the base DNN (ONNX with named taps)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="export EfficientNet-Lite0 with its taps to ONNX (needs torch)")
    export.add_argument("--out", type=Path, help="where to write it (default: the cache used by the edge)")
    export.set_defaults(func=_export)
    info = actions.add_parser("info", help="list the taps of a base model and their shapes at an input size")
    info.add_argument("--model", type=Path, help="an ONNX base model (default: the exported EfficientNet-Lite0)")
    info.add_argument("--input-size", default="768x448", help="WxH, multiples of 32 (default 768x448)")
    info.set_defaults(func=_info)


def _export(args: argparse.Namespace) -> int:
    from models.base_export import default_base_model_path, export_base_model

    path = export_base_model(args.out or default_base_model_path())
    print(path)
    return 0


def _info(args: argparse.Namespace) -> int:
    from filterforward.commands.options import parse_size
    from models.basednn import BaseDNN

    base = BaseDNN(parse_size(args.input_size), args.model)
    print(f"model: {base.model_path}")
    for tap in base.taps.values():
        channels, height, width = tap.shape(base.input_size)
        print(f"  {tap.name:<8} stride {tap.stride:>2}  {channels} x {height} x {width}")
    return 0
