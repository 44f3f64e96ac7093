"""CURVE keys for the ZeroMQ links: key files (zmq.auth's certificate format) and socket setup.

`filterforward keys create NAME` writes NAME.key (public, safe to copy) and NAME.key_secret (mode 0600).
The cloud is the CURVE server on both of its sockets; each edge is a client that knows the cloud's public key.
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq
import zmq.auth

from models.errors import FilterForwardError


def create_keypair(folder: Path, name: str) -> tuple[Path, Path]:
    """Write folder/name.key and folder/name.key_secret; refuses to overwrite an existing keypair."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    if public.exists() or secret.exists():
        raise FilterForwardError(f"{public} or {secret} already exists: pick another name or delete them first")
    public_path, secret_path = zmq.auth.create_certificates(str(folder), name)
    os.chmod(secret_path, 0o600)
    return Path(public_path), Path(secret_path)


def load_public(path: Path) -> bytes:
    """The Z85 public key in a .key or .key_secret file."""
    public, _ = _load(path)
    return public


def load_server_public(path: Path) -> bytes:
    """The server's public key, for a client: from its .key file. Its .key_secret is refused: the server's secret key
    has no business on the client's machine (it would let the client pose as the server)."""
    public, secret = _load(path)
    if secret is not None:
        raise FilterForwardError(
            f"{path} holds a secret key: give the public .key file; a secret key stays on the machine it belongs to"
        )
    return public


def load_keypair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a .key_secret file."""
    public, secret = _load(path)
    if secret is None:
        raise FilterForwardError(f"{path} holds no secret key: give the .key_secret file, not the public .key")
    return public, secret


def _load(path: Path) -> tuple[bytes, bytes | None]:
    path = Path(path)
    if path.is_dir():
        raise FilterForwardError(f"key file {path} is a folder: give the key file in it (NAME.key or NAME.key_secret)")
    if not path.is_file():
        raise FilterForwardError(f"key file {path} does not exist: create it with `filterforward keys create`")
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (ValueError, OSError) as exc:
        raise FilterForwardError(f"key file {path} is not a ZeroMQ certificate ({exc}); recreate it") from None
    if public is None:
        raise FilterForwardError(f"key file {path} holds no public key; recreate it with `filterforward keys create`")
    return public, secret


def make_server(socket: zmq.Socket, secret_file: Path) -> None:
    """Make `socket` a CURVE server with the keypair in `secret_file` (call before bind)."""
    public, secret = load_keypair(secret_file)
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True


def make_client(socket: zmq.Socket, secret_file: Path, server_public_file: Path) -> None:
    """Make `socket` a CURVE client of the server whose public key is in `server_public_file` (before connect)."""
    public, secret = load_keypair(secret_file)
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = load_server_public(server_public_file)
