"""`filterforward models`: export and inspect the base DNN."""

from __future__ import annotations

import argparse
from pathlib import Path

# Listed here rather than imported: models.base_precision loads onnx, which would slow every command's start.
# tests/test_base_precision.py checks that they match.
PRECISIONS_HELP = "fp32 (default), int8 or bf16"
RUNTIMES = ("auto", "onnxruntime", "openvino")
DEFAULT_FRAMES_HELP = "default 64"


DEFAULT_INT8_SIZE = "768x448"
INT8_OPTIONS = {  # option -> its argparse destination
    "--calibration": "calibration",
    "--calibration-frames": "calibration_frames",
    "--input-size": "input_size",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="export or inspect the base DNN (ONNX with named taps)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser(
        "export",
        help="export EfficientNet-Lite0 with its taps to ONNX (needs torch), at fp32 or a reduced precision",
        description="int8 is calibrated on real frames of your cameras (--calibration) and runs anywhere (faster "
        "still with the [openvino] extra); bf16 needs the [openvino] extra and a CPU with bf16 (AVX512-BF16 or AMX), "
        "else it runs in fp32. Point the edge's `base_model:` and training's --base-model at the file printed.",
    )
    export.add_argument("--out", type=Path, help="where to write it (default: the cache used by the edge)")
    export.add_argument("--precision", default="fp32", help=f"numeric precision: {PRECISIONS_HELP}")
    export.add_argument(
        "--calibration", type=Path, nargs="+", default=[], metavar="SOURCE",
        help="int8: dataset folders, videos or image folders of the cameras the edge will watch",
    )  # fmt: skip
    export.add_argument(
        "--calibration-frames", type=int, default=None,
        help=f"int8: frames spread evenly over the sources ({DEFAULT_FRAMES_HELP})",
    )  # fmt: skip
    export.add_argument("--input-size", help=f"int8: the edge's input size, WxH (default {DEFAULT_INT8_SIZE})")
    export.set_defaults(func=_export)
    info = actions.add_parser("info", help="list the taps of a base model and their shapes at an input size")
    info.add_argument(
        "--base-model",
        "--model",
        dest="model",
        type=Path,
        help="an ONNX base model, as train and eval take it (default: the exported EfficientNet-Lite0)",
    )
    info.add_argument("--input-size", default="768x448", help="WxH, multiples of 32 (default 768x448)")
    info.add_argument("--runtime", default="auto", choices=RUNTIMES, help="what runs it (default: by its precision)")
    info.set_defaults(func=_info)


def _export(args: argparse.Namespace) -> int:
    from filterforward.commands.options import check_writable, parse_size
    from models.base_precision import DEFAULT_CALIBRATION_FRAMES, check_precision, export_precision
    from models.errors import FilterForwardError

    if args.out is not None:  # before the calibration's minutes, not after them
        check_writable(args.out, "--out", folder=False)
    precision = check_precision(args.precision)
    int8_only = [flag for flag, value in INT8_OPTIONS.items() if getattr(args, value) not in (None, [])]
    if precision != "int8" and int8_only:  # they were ignored: a "calibrated" fp32 export that is not
        them = "them" if len(int8_only) > 1 else "it"
        raise FilterForwardError(f"--precision {precision} takes no {', '.join(int8_only)}: drop {them} or export int8")
    size = parse_size(args.input_size or DEFAULT_INT8_SIZE)
    frames = DEFAULT_CALIBRATION_FRAMES if args.calibration_frames is None else args.calibration_frames
    print(export_precision(precision, args.out, args.calibration, frames, size))
    return 0


def _info(args: argparse.Namespace) -> int:
    from filterforward.commands.options import parse_size
    from models.basednn import BaseDNN

    base = BaseDNN(parse_size(args.input_size), args.model, runtime=args.runtime)
    print(f"model: {base.model_path}")
    print(f"identity: {base.identity}")
    print(f"runtime: {base.runner.description}")
    for tap in base.taps.values():
        channels, height, width = tap.shape(base.input_size)
        print(f"  {tap.name:<8} stride {tap.stride:>2}  {channels} x {height} x {width}")
    return 0
