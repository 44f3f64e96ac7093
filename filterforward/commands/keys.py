"""`filterforward keys`: create and inspect the CURVE keypairs of the ZeroMQ links between edges and the cloud."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from models.errors import FilterForwardError

CLOUD = "cloud"  # the name of the cloud's keypair; every other name is an edge id


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "keys",
        help="create or show CURVE keypairs for the edge <-> cloud links",
        description="The ZeroMQ links between edges and the cloud are encrypted and authenticated with CURVE: the "
        "cloud has a keypair, each edge has one, and the cloud only accepts edges whose public key is in its "
        "zmq.edge_keys folder.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create",
        help="write NAME.key (public) and NAME.key_secret (secret, mode 0600)",
        description="Creates a CURVE keypair in ZeroMQ's certificate format. Create one named `cloud` for the "
        "cloud service and one per edge, named after its edge_id. The .key file is public: copy the cloud's to "
        "every edge (cloud.server_key) and each edge's into the cloud's zmq.edge_keys folder (the allow-list; "
        "the file name is the edge id). The .key_secret file never leaves the machine it was made for. "
        "Refuses to overwrite an existing keypair.",
    )
    create.add_argument("name", metavar="NAME", help="the edge id, or `cloud` (letters, digits, _ . -)")
    create.add_argument("--dir", type=Path, default=Path("keys"), help="folder to write to (default: keys)")
    create.set_defaults(func=_create)
    show = actions.add_parser(
        "show",
        help="print the public key in a .key or .key_secret file",
        description="Prints the Z85 public key held in FILE, e.g. to compare it with the key an edge reports.",
    )
    show.add_argument("file", type=Path, metavar="FILE", help="a .key or .key_secret file")
    show.set_defaults(func=_show)


def _create(args: argparse.Namespace) -> int:
    from common.curve import create_keypair
    from common.protocol import ID_PATTERN
    from filterforward.commands.options import check_writable

    if not re.fullmatch(ID_PATTERN, args.name):
        raise FilterForwardError(
            f"key name {args.name!r} is not an id: use up to 64 letters, digits, '_', '.' or '-' (e.g. edge-1)"
        )
    check_writable(args.dir, "--dir", folder=True)
    public, secret = create_keypair(args.dir, args.name)
    print(f"public key: {public}  (safe to copy)")
    print(f"secret key: {secret}  (keep it on this machine; mode 0600)")
    if args.name == CLOUD:
        print(f"next: set zmq.secret_key: {secret} in the cloud's config and copy {public.name} to each edge as "
              "its cloud.server_key")  # fmt: skip
    else:
        print(
            f"next: set cloud.secret_key: {secret} in the config of the edge whose edge_id is {args.name}, and copy "
            f"{public.name} into the cloud's zmq.edge_keys folder"
        )
    return 0


def _show(args: argparse.Namespace) -> int:
    from common.curve import load_public

    print(load_public(args.file).decode("ascii"))
    return 0
