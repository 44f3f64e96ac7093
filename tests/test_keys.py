"""`filterforward keys` as a real process: creates CURVE keypairs, refuses to overwrite them, shows public keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import zmq.auth


def filterforward(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "filterforward", *args], capture_output=True, text=True, timeout=120)


def test_create_writes_a_keypair_and_says_where_each_file_goes(tmp_path: Path) -> None:
    result = filterforward("keys", "create", "edge-1", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    public, secret = tmp_path / "edge-1.key", tmp_path / "edge-1.key_secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    public_key, secret_key = zmq.auth.load_certificate(str(secret))
    assert zmq.auth.load_certificate(str(public)) == (public_key, None) and secret_key is not None
    assert str(public) in result.stdout and str(secret) in result.stdout
    assert "copy edge-1.key into the cloud's zmq.edge_keys folder" in result.stdout
    assert "server_key" not in result.stdout  # the cloud's advice is for the cloud's key only
    cloud = filterforward("keys", "create", "cloud", "--dir", str(tmp_path))
    assert "copy cloud.key to each edge as its cloud.server_key" in cloud.stdout
    assert "edge_keys" not in cloud.stdout


def test_create_refuses_to_overwrite_and_bad_names(tmp_path: Path) -> None:
    assert filterforward("keys", "create", "cloud", "--dir", str(tmp_path)).returncode == 0
    before = (tmp_path / "cloud.key_secret").read_bytes()
    result = filterforward("keys", "create", "cloud", "--dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "already exists" in result.stderr
    assert (tmp_path / "cloud.key_secret").read_bytes() == before
    result = filterforward("keys", "create", "../escape", "--dir", str(tmp_path))
    assert result.returncode == 2 and "is not an id" in result.stderr
    assert not (tmp_path.parent / "escape.key").exists()
    result = filterforward("keys", "create", "edge-3", "--dir", str(tmp_path / "cloud.key"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"--dir {tmp_path / 'cloud.key'} is a file, not a folder: give a folder path" in result.stderr


def test_show_prints_the_public_key(tmp_path: Path) -> None:
    assert filterforward("keys", "create", "edge-2", "--dir", str(tmp_path)).returncode == 0
    public_key, _ = zmq.auth.load_certificate(str(tmp_path / "edge-2.key"))
    for name in ("edge-2.key", "edge-2.key_secret"):
        result = filterforward("keys", "show", str(tmp_path / name))
        assert result.returncode == 0, result.stderr
        assert result.stdout == public_key.decode() + "\n"
    result = filterforward("keys", "show", str(tmp_path / "missing.key"))
    assert result.returncode == 2 and "does not exist" in result.stderr
    result = filterforward("keys", "show", str(tmp_path))
    assert result.returncode == 2
    assert f"key file {tmp_path} is a folder: give the key file in it (NAME.key or NAME.key_secret)" in result.stderr
