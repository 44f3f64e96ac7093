"""A private Docker engine for the tests, and a stand-in for `python:3.11-slim` built without Docker Hub.

The engine is Debian's dockerd (package docker.io) run as root with the vfs storage driver, no iptables and no
default bridge, its data root, exec root and socket in one temporary folder; the docker CLI and compose reach it
through DOCKER_HOST. Leaving the block stops every container and removes the images, volumes, networks, the
daemon and its folder, also when the test failed.

The base image is Debian bookworm from `debootstrap --variant=minbase` with Debian's Python 3.11, pip and venv,
the host's CA bundle (so pip reaches PyPI wherever the host's pip does) and pip usable as in the slim image (no
EXTERNALLY-MANAGED marker, `python` and `pip` on PATH), imported with `docker import`. Its root file system is
cached as a tar file under ~/.cache/filterforward/docker-base, keyed by the recipe and the CA bundle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "filterforward"
HOST_CA_BUNDLE = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
# Everything that decides the base image's content; the cache key is its hash (with the CA bundle's).
BASE_RECIPE = {
    "suite": "bookworm",
    "mirror": "",  # debootstrap's default Debian mirror
    "variant": "minbase",
    "include": ["python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates"],
    # Trimmed after debootstrap: apt's downloads and lists, documentation, translations.
    "remove": ["var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"],
    # pip installs into /usr/local as in the slim image (PEP 668's marker would refuse it).
    "unmanaged": "usr/lib/python3.11/EXTERNALLY-MANAGED",
    "changes": [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        'CMD ["python3"]',
    ],
}
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class DockerError(RuntimeError):
    pass


def missing_tools() -> list[str]:
    """What the engine needs and this machine lacks (root, dockerd, debootstrap)."""
    missing = [tool for tool in ("dockerd", "debootstrap") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (dockerd and debootstrap run as root)")
    return missing


def docker_cli() -> str:
    """Debian's docker CLI beside its dockerd (same release; it builds with BuildKit without the buildx plugin),
    else whichever `docker` is on PATH."""
    beside = Path(shutil.which("dockerd") or "/usr/sbin/dockerd").parent.parent / "bin" / "docker"
    return str(beside) if beside.exists() else (shutil.which("docker") or "docker")


def compose_command(env: dict[str, str]) -> list[str] | None:
    """`docker compose` (v2) where the plugin is there, else Debian's `docker-compose` (v1); None: neither."""
    probe = subprocess.run([docker_cli(), "compose", "version"], capture_output=True, env=env)
    if probe.returncode == 0:
        return [docker_cli(), "compose"]
    v1 = shutil.which("docker-compose")
    return [v1] if v1 else None


# -- the stand-in base image -------------------------------------------------------------------------------------


def base_key() -> str:
    digest = hashlib.sha256(json.dumps(BASE_RECIPE, sort_keys=True).encode())
    digest.update(HOST_CA_BUNDLE.read_bytes())
    return digest.hexdigest()[:16]


def base_rootfs(cache: Path = CACHE / "docker-base") -> Path:
    """The base image's root file system as a tar file: from the cache, else made with debootstrap (a minute)."""
    tar = cache / f"bookworm-python3-{base_key()}.tar"
    if tar.exists():
        return tar
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache))
    try:
        rootfs = work / "rootfs"
        recipe = BASE_RECIPE
        command = [
            "debootstrap", f"--variant={recipe['variant']}", f"--include={','.join(recipe['include'])}",
            recipe["suite"], str(rootfs), *([recipe["mirror"]] if recipe["mirror"] else []),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise DockerError(f"debootstrap failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr}")
        for path in recipe["remove"]:
            shutil.rmtree(rootfs / path, ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        (rootfs / recipe["unmanaged"]).unlink(missing_ok=True)
        # The host's bundle replaces Debian's (it holds Debian's roots and whatever the host's network adds).
        shutil.copyfile(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
        partial = work / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], check=True)
        for stale in cache.glob("bookworm-python3-*.tar"):  # an older recipe's
            stale.unlink()
        partial.rename(tar)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tar


# -- the engine --------------------------------------------------------------------------------------------------


class DockerEngine:
    """dockerd as a child process with everything under one temporary folder."""

    def __init__(self) -> None:
        # Short: unix socket paths (containerd's among them, under the exec root) are limited to 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="ffd-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.log = self.root / "dockerd.log"
        self.process: subprocess.Popen | None = None
        self.cli = docker_cli()

    @property
    def env(self) -> dict[str, str]:
        """This machine's environment pointed at this engine (for the docker CLI and compose)."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("DOCKER_", "COMPOSE_"))}
        return {**env, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_CONFIG": str(self.root / "client")}

    def start(self) -> None:
        command = [
            "dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
            "--pidfile", str(self.root / "docker.pid"), "--host", f"unix://{self.socket}",
            "--storage-driver=vfs", "--iptables=false", "--bridge=none",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise DockerError(f"dockerd did not start:\n{self.log_tail()}")
            time.sleep(0.2)

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.settimeout(2)
                sock.connect(str(self.socket))
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                return b"200 OK" in sock.recv(1024)
            except OSError:
                return False

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"

    @property
    def build_env(self) -> dict[str, str]:
        """For `docker build`: BuildKit (metadata steps cost no layer copy on vfs), which Debian's CLI has built in;
        another CLI keeps its own default (without the buildx plugin, BuildKit would fail there)."""
        debian = Path(self.cli) == Path(shutil.which("dockerd") or "/usr/sbin/dockerd").parent.parent / "bin/docker"
        return {**self.env, "DOCKER_BUILDKIT": "1"} if debian else self.env

    def docker(self, *args: str, timeout: float = 600, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """Run the docker CLI against this engine; text output captured unless told otherwise."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("env", self.env)
        result = subprocess.run([self.cli, *args], timeout=timeout, **kwargs)
        if check and result.returncode != 0:
            raise DockerError(f"docker {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def import_base(self, tar: Path, tag: str) -> str:
        changes = [arg for change in BASE_RECIPE["changes"] for arg in ("--change", change)]
        self.docker("import", *changes, str(tar), tag)
        return tag

    def image_size(self, image: str) -> int:
        return int(self.docker("image", "inspect", "--format", "{{.Size}}", image).stdout)

    def stop(self) -> None:
        """Remove every container, volume, network and image, stop dockerd and delete its folder."""
        try:
            if self.process is not None and self.process.poll() is None:
                self._remove_everything()
        finally:
            self._stop_daemon()
            self._kill_leftovers()
            self._unmount()
            shutil.rmtree(self.root, ignore_errors=True)

    def _remove_everything(self) -> None:
        with contextlib.suppress(DockerError, subprocess.TimeoutExpired):
            containers = self.docker("ps", "-aq", timeout=60).stdout.split()
            if containers:
                self.docker("rm", "--force", "--volumes", *containers, timeout=120, check=False)
            self.docker("volume", "prune", "--force", timeout=120, check=False)
            self.docker("network", "prune", "--force", timeout=60, check=False)
            images = self.docker("images", "-aq", timeout=60).stdout.split()
            if images:
                self.docker("rmi", "--force", *sorted(set(images)), timeout=300, check=False)
            self.docker("builder", "prune", "--all", "--force", timeout=120, check=False)

    def _stop_daemon(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _kill_leftovers(self) -> None:
        """containerd and its shims, started by this dockerd, name this engine's folder on their command line."""
        marker = str(self.root).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)

    def _unmount(self) -> None:
        prefix = f"{self.root}/"
        with contextlib.suppress(OSError):
            mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
            for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
                subprocess.run(["umount", "--lazy", mount], capture_output=True)


@contextlib.contextmanager
def docker_engine() -> Iterator[DockerEngine]:
    engine = DockerEngine()
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


# -- a wheel folder the builds reach over the host network -------------------------------------------------------


def cpu_torch_wheel(version: str = "2.13.0", folder: Path = CACHE / "docker-wheels") -> Path:
    """The CPU build of torch as a wheel for the images' Python (3.11, the host's too), fetched by the host's pip
    (here it takes the file on this machine's disk); never the CUDA build."""
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"torch-{version}+cpu-*.whl"))
    if not found:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(folder)]
        result = subprocess.run([*command, f"torch=={version}+cpu"], capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise DockerError(f"no CPU build of torch {version} for the images:\n{result.stderr[-3000:]}")
        found = sorted(folder.glob(f"torch-{version}+cpu-*.whl"))
    if not found:
        raise DockerError(f"pip did not leave torch-{version}+cpu in {folder}")
    return found[-1]


@contextlib.contextmanager
def wheel_server(folder: Path) -> Iterator[str]:
    """Serve `folder` on 127.0.0.1 as a flat page of links (pip's --find-links); yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as sock, contextlib.suppress(OSError):
                sock.connect(("127.0.0.1", port))
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise DockerError("the wheel server did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(timeout=10)
