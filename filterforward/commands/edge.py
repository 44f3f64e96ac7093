"""`filterforward edge`: run an edge node from its YAML config."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from models.errors import FilterForwardError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("edge", help="run an edge node on its cameras")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    run_parser = actions.add_parser(
        "run",
        help="filter the configured cameras; matched frames and events go to the cloud or the sink folder",
        description="Runs the base DNN once per frame on every configured camera, every loaded filter on its "
        "taps, and sends matched frames (by default one H.264 stream per camera in short fragments, "
        "upload.fragment_seconds; JPEGs or event clips where a filter asks) and events to the cloud when `cloud:` is "
        "configured (spooled on disk until acknowledged; the cloud's filters are applied as they change), else writes "
        "them with events.jsonl to the sink folder. Logs a stats line per camera every stats_interval seconds and "
        "serves Prometheus metrics on metrics_port when set. Stops at the end of file sources or on "
        "Ctrl-C/SIGTERM: open events are closed and the cloud gets up to min(10 s, cloud.timeout) to "
        "acknowledge what is spooled (a second signal stops at once); the rest is sent first on the next start.",
    )
    run_parser.add_argument("--config", type=Path, required=True, help="edge YAML file")
    run_parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edge.config import load_edge_config
    from edge.node import EdgeNode

    node = EdgeNode(load_edge_config(args.config))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: node.stop())
    node.run()
    problems = node.problems()
    if problems:  # the run went to its end, but not all of it was filtered: say so in the exit status too
        raise FilterForwardError("; ".join(problems))
    return 0
