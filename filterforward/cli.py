"""`filterforward`: one command, a subcommand per job. Subcommands import their heavy modules lazily."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from models.errors import FilterForwardError

# Each module in filterforward.commands exposes register(subparsers) and sets a `func` default.
COMMANDS = ("demo", "dataset", "models", "train", "eval", "edge", "cloud", "keys", "config", "camera", "trainer")


class ExactOptionParser(argparse.ArgumentParser):
    """Options match only when spelled whole: argparse's prefix matching took `trainer serve --token T` as
    `--token-env T`. Subcommand parsers are made of the same class, so the rule holds all the way down."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = ExactOptionParser(
        prog="filterforward",
        description="Edge video filtering: one shared base DNN per frame, many tiny microclassifiers, "
        "only the frames your applications care about leave the edge.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, tracebacks, and OpenCV's own warnings"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"filterforward.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.verbose:
        # OpenCV's own warnings repeat what our messages say (a camera that cannot be opened logs "backend is
        # generally available but can't be used to capture by name" on every reconnect); FFmpeg's stay. Read
        # when cv2 is first imported, which the subcommands do lazily, after this.
        os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Alembic (the cloud's schema migrations) logs at INFO on import and at each step; cloud.migrations logs its own.
    logging.getLogger("alembic").setLevel(logging.NOTSET if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except FilterForwardError as exc:
        print(f"filterforward {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the file system or the network said no: one line, the traceback only with -v
        if args.verbose:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"filterforward {args.command}: error: {where}{exc.strerror or exc} (-v shows where)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
