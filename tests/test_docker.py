"""docker-compose.yml and deploy/compose.edge.yml for real: both images built, the stacks run under a Docker engine.

The engine is this test's own (tests/docker_engine.py: Debian's dockerd as root, vfs, everything under one
temporary folder, removed afterwards). Docker Hub is out of reach, so PYTHON_IMAGE is a stand-in made with
debootstrap; the edge image's export stage takes the CPU build of torch from the host's wheel, served over the host
network (PIP_FIND_LINKS), with pip's default index for everything else. Compose is the v2 plugin where it is
installed, else Debian's docker-compose v1, which is given the same file without the two v2-only keys (`name`, the
project name, goes to -p; a `depends_on` entry marked `required: false` is left out, its service being off).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cloud_server import READ_ONLY, READ_WRITE, run_cloud
from docker_engine import (
    DockerEngine,
    base_rootfs,
    compose_command,
    cpu_torch_wheel,
    docker_engine,
    missing_tools,
    wheel_server,
)
from support import free_port
from test_compose import (
    COMPOSE,
    DASHBOARD_TOKEN,
    EDGE_BOX,
    FILTER,
    OPERATOR_TOKEN,
    TRAINER_TOKEN,
    read_compose,
    require_free,
    seconds,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "filterforward-test/python:3.11-bookworm"
TAG = "docker-test"
USER = "10001:10001"
BASE_MODEL = "/opt/filterforward/base/efficientnet_lite0.onnx"  # exported in the build stage (deploy/)
EDGE_INPUT = (768, 448)  # input_size in deploy/compose/edge.yaml
WAIT_S = 180.0  # bounds waits on containers (health checks run every 30 s); only a broken setup reaches it


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll once a second (each look runs the docker CLI): the timeout only keeps a broken setup from hanging."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(1.0)


@dataclass
class Images:
    base: str
    seconds: dict[str, float]  # base, cloud, edge, trainer
    sizes: dict[str, int]  # cloud, edge, trainer: bytes


@pytest.fixture(scope="module")
def engine() -> Iterator[DockerEngine]:
    missing = missing_tools()
    if missing:
        message = f"no Docker engine here, missing: {', '.join(missing)} (.ci/run installs the packages)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with docker_engine() as engine:
        yield engine


def image(name: str) -> str:
    return f"filterforward-{name}:{TAG}"


@pytest.fixture(scope="module")
def images(engine: DockerEngine) -> Images:
    """The stand-in base image, then deploy/Dockerfile.cloud and deploy/Dockerfile.edge built on it."""
    started = time.monotonic()
    base = engine.import_base(base_rootfs(), BASE_IMAGE)
    times = {"base": time.monotonic() - started}
    torch_wheel = cpu_torch_wheel()
    with wheel_server(torch_wheel.parent) as wheels:
        torch_args = ["--build-arg", "TORCH_INDEX_URL=", "--build-arg", f"PIP_FIND_LINKS={wheels}"]
        for name, dockerfile, args in (
            ("cloud", "cloud", []),
            ("edge", "edge", torch_args),
            ("trainer", "edge", [*torch_args, "--target", "trainer"]),  # the edge's export stage, from the cache
        ):
            started = time.monotonic()
            build = [
                "build", "--network", "host", "--file", f"deploy/Dockerfile.{dockerfile}",
                "--build-arg", f"PYTHON_IMAGE={base}", *args, "--tag", image(name), ".",
            ]  # fmt: skip
            result = engine.docker(*build, cwd=REPO, env=engine.build_env, check=False, timeout=1200)
            assert result.returncode == 0, f"{name} image build failed:\n{result.stdout[-6000:]}{result.stderr[-6000:]}"
            times[name] = time.monotonic() - started
    sizes = {name: engine.image_size(image(name)) for name in ("cloud", "edge", "trainer")}
    summary = ", ".join(f"{name} {sizes.get(name, 0) / 2**20:.0f} MiB in {times[name]:.0f} s" for name in times)
    print(f"images: {summary}", file=sys.stderr)
    return Images(base, times, sizes)


# -- compose against the engine ----------------------------------------------------------------------------------


def for_compose_v1(path: Path, folder: Path) -> tuple[Path, str]:
    """The file as compose v1 (1.29) takes it, and its project name."""
    compose = read_compose(path)
    name = compose.pop("name")
    for service in compose["services"].values():
        needs = service.get("depends_on", {})
        for dependency in [key for key, need in needs.items() if need.get("required") is False]:
            del needs[dependency]
    out = folder / f"v1-{path.name}"
    out.write_text(yaml.safe_dump(compose, sort_keys=False))
    return out, name


class Stack:
    """One compose file brought up on the engine: `docker compose -f FILE` with an .env's variables."""

    def __init__(self, engine: DockerEngine, path: Path, env: dict[str, str], folder: Path, *profiles: str) -> None:
        self.engine = engine
        # docker-compose 1.x gives up on a Docker API call after 60 s: removing a container on the vfs storage
        # driver of a loaded CI machine took longer (compose down failed after the test had passed).
        self.env = {**engine.env, "FF_TAG": TAG, "COMPOSE_HTTP_TIMEOUT": "300", **env}
        command = compose_command(self.env)
        assert command is not None, "neither `docker compose` nor docker-compose is installed"
        folder.mkdir(parents=True, exist_ok=True)
        if command[-1] == "compose":  # v2
            self.name, files = read_compose(path)["name"], ["--file", str(path)]
        else:
            v1_file, self.name = for_compose_v1(path, folder)
            files = ["--file", str(v1_file), "--project-directory", str(path.parent)]
        options = [option for profile in profiles for option in ("--profile", profile)]
        self.command = [*command, *files, "--project-name", self.name, *options]
        self.v2 = command[-1] == "compose"
        self.services = {
            name: spec
            for name, spec in read_compose(path)["services"].items()
            if not spec.get("profiles") or set(spec["profiles"]) & set(profiles)
        }

    def compose(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [*self.command, *args], env=self.env, input=input, capture_output=True, text=True, timeout=600
        )
        if check:
            assert result.returncode == 0, f"compose {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
        return result

    def container(self, service: str) -> str:
        ids = self.compose("ps", *(["--all"] if self.v2 else []), "--quiet", service).stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def state(self, service: str) -> dict[str, Any]:
        return json.loads(self.engine.docker("inspect", "--format", "{{json .State}}", self.container(service)).stdout)

    def restarts(self, service: str) -> int:
        return int(self.engine.docker("inspect", "--format", "{{.RestartCount}}", self.container(service)).stdout)

    def wait_healthy(self, *services: str) -> None:
        for service in services:

            def healthy(service: str = service) -> bool:
                state = self.state(service)
                assert state["Status"] in ("created", "running", "restarting"), f"{service}: {state}\n{self.logs()}"
                return state.get("Health", {}).get("Status") == "healthy"

            wait_until(healthy, f"{service} to turn healthy", timeout=WAIT_S)

    def python(self, service: str, code: str, *args: str) -> Any:
        """Run Python in the service's running container (as its user); what it prints, as JSON."""
        result = self.engine.docker("exec", self.container(service), "python", "-c", code, *args)
        return json.loads(result.stdout)

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "60", check=False).stdout[-8000:]

    def down(self) -> None:
        """`docker compose down`: every service must stop within its grace period, with exit status 0."""
        since = self.engine.docker("info", "--format", "{{json .SystemTime}}").stdout.strip().strip('"')
        started = time.monotonic()
        self.compose("stop")  # what the grace period bounds; removing vfs copies of the containers is timed apart
        took = time.monotonic() - started
        self.compose("down", "--volumes")
        removal = time.monotonic() - started - took
        until = self.engine.docker("info", "--format", "{{json .SystemTime}}").stdout.strip().strip('"')
        events = self.engine.docker(
            "events", "--since", since, "--until", until, "--filter", "event=die",
            "--filter", f"label=com.docker.compose.project={self.name}",
            "--format", '{{index .Actor.Attributes "com.docker.compose.service"}} {{.Actor.Attributes.exitCode}}',
        ).stdout.split("\n")  # fmt: skip
        exits = dict(line.split() for line in events if line.strip())
        grace = max(seconds(spec.get("stop_grace_period", "10s")) for spec in self.services.values())
        running = {name for name, spec in self.services.items() if spec.get("restart") != "no"}
        assert all(exits.get(name) == "0" for name in running), f"exit statuses after SIGTERM: {exits}"
        assert took < grace + 15, f"stopping took {took:.0f} s (grace period {grace:.0f} s)"
        print(f"{self.name}: stopped in {took:.1f} s, removed in {removal:.0f} s, exits {exits}", file=sys.stderr)


@pytest.fixture
def stacks() -> Iterator[list[Stack]]:
    """Stacks still up when a test ends are taken down (the engine removes what remains anyway)."""
    up: list[Stack] = []
    yield up
    for stack in up:
        stack.compose("down", "--volumes", "--timeout", "5", check=False)


# -- REST and the databases inside the containers ----------------------------------------------------------------


def register_always_firing_filter(api: httpx.Client, make_filter: Callable) -> None:
    spec, onnx = make_filter("full_frame", "late", EDGE_INPUT, name=FILTER, bias=10.0)
    response = api.post(
        "/api/filters",
        data={"spec": spec.model_dump_json()},
        files={"model": ("model.onnx", onnx, "application/octet-stream")},
    )
    assert response.status_code == 201, response.text


def wait_for_stored_frame(api: httpx.Client, edge: str, stack: Stack) -> None:
    """An event of the filter from `edge` with a stored frame, whose JPEG is served."""

    def stored() -> bool:
        items = api.get("/api/events", params={"filter": FILTER}).json()["items"]
        return any(item["edge"] == edge and item["frames"] > 0 and item["thumbnail_url"] for item in items)

    try:
        wait_until(stored, f"a matched frame from {edge} stored in the cloud", timeout=WAIT_S)
    except BaseException:
        print(stack.logs(), file=sys.stderr)
        raise
    event = next(item for item in api.get("/api/events", params={"filter": FILTER}).json()["items"])
    jpeg = api.get(event["thumbnail_url"])
    assert jpeg.status_code == 200 and jpeg.content.startswith(b"\xff\xd8"), "the stored frame is no JPEG"


SPOOLED = """
import json, sqlite3
db = sqlite3.connect("file:/var/lib/filterforward/spool/spool.sqlite?mode=ro", uri=True)
print(json.dumps([seq for (seq,) in db.execute("SELECT seq FROM messages")]))
"""
RECEIVED = """
import json, sqlite3, sys
db = sqlite3.connect("file:/var/lib/filterforward/cloud/filterforward.db?mode=ro", uri=True)
print(json.dumps([seq for (seq,) in db.execute("SELECT seq FROM received WHERE edge_id = ?", (sys.argv[1],))]))
"""


# -- the tests -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cloud", "edge", "trainer"])
def test_images_run_as_non_root_and_only_the_trainer_holds_torch(
    engine: DockerEngine, images: Images, name: str
) -> None:
    config = json.loads(engine.docker("image", "inspect", "--format", "{{json .Config}}", image(name)).stdout)
    assert config["User"] == USER and config["Healthcheck"]["Test"][0] == "CMD"
    # One container of the image (under the vfs driver each copies the image's files: the trainer's take a minute).
    probe = (
        "import hashlib, importlib.util as u, json, os, sys; "
        f"base = {BASE_MODEL!r}; "
        "print(json.dumps({'uid': os.getuid(), 'version': sys.version_info[:2], "
        "'modules': {m: u.find_spec(m) is not None for m in ('torch', 'onnxruntime', 'openvino', 'fastapi', 'cv2')}, "
        "'base_model': hashlib.sha256(open(base, 'rb').read()).hexdigest() if os.path.isfile(base) else None}))"
    )
    seen = probe_image(engine, name, probe)
    assert seen["uid"] == 10001 and seen["version"] == [3, 11]
    assert seen["modules"]["torch"] is (name == "trainer"), f"torch in the {name} image: {seen['modules']['torch']}"
    assert seen["modules"]["onnxruntime"] is True and seen["modules"]["cv2"] is True
    if name == "trainer":  # trains on the very base DNN file the edges run, so they accept its filters
        assert seen["base_model"] == probe_image(engine, "edge", probe)["base_model"] is not None
    elif name == "edge":
        assert seen["modules"]["openvino"] is True and seen["base_model"] is not None
    else:
        assert seen["modules"]["fastapi"] is True
    print(f"{name}: {images.sizes[name] / 2**20:.0f} MiB, built in {images.seconds[name]:.0f} s", file=sys.stderr)


def probe_image(engine: DockerEngine, name: str, script: str) -> dict[str, Any]:
    """What a Python script prints as JSON in a container of the image, without a network."""
    return json.loads(engine.docker("run", "--rm", "--network", "none", image(name), "python", "-c", script).stdout)


def test_all_in_one_compose_stores_matched_frames_and_loses_none_across_an_edge_crash(
    engine: DockerEngine, images: Images, stacks: list[Stack], short_clip: Path, make_filter: Callable,
    tmp_path: Path,
) -> None:  # fmt: skip
    """docker-compose.yml with the replayed camera: healthy services, a matched frame stored; the cloud stopped, the
    edge spools; the edge's process killed -9, its restart policy brings it back with the spool intact, and every
    message it held reaches the cloud; `down` stops all within the grace period, each with status 0."""
    port = free_port()
    env = {
        "FF_OPERATOR_TOKEN": OPERATOR_TOKEN, "FF_DASHBOARD_TOKEN": DASHBOARD_TOKEN, "FF_TRAINER_TOKEN": TRAINER_TOKEN,
        "FF_CLIP": str(short_clip), "FF_HTTP_PORT": str(port),
    }  # fmt: skip
    require_free({5555, 5556})  # published as declared
    stack = Stack(engine, COMPOSE, env, tmp_path)
    stacks.append(stack)
    stack.compose("up", "--detach", "--no-build")
    assert stack.state("keys")["ExitCode"] == 0
    stack.wait_healthy("cloud", "camera", "edge", "trainer")

    base_url = f"http://127.0.0.1:{port}"
    with (
        httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=30) as api,
        httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {DASHBOARD_TOKEN}"}, timeout=30) as view,
    ):
        register_always_firing_filter(api, make_filter)
        wait_for_stored_frame(view, "edge-1", stack)

    # The cloud away: the edge keeps matching and spools what the cloud has not acknowledged.
    stack.compose("stop", "cloud")
    wait_until(lambda: len(stack.python("edge", SPOOLED)) >= 5, "messages spooled at the edge", timeout=WAIT_S)
    held = set(stack.python("edge", SPOOLED))
    pid, restarts = stack.state("edge")["Pid"], stack.restarts("edge")
    os.kill(pid, signal.SIGKILL)  # a crash, not `docker kill` (which a restart policy honours as a stop)

    def restarted() -> bool:
        state = stack.state("edge")
        return stack.restarts("edge") > restarts and state["Running"] and state["Pid"] not in (0, pid)

    wait_until(restarted, "the edge's restart policy to restart it", timeout=WAIT_S)
    kept = set(stack.python("edge", SPOOLED))
    assert held <= kept, f"the spool lost {sorted(held - kept)} across the restart"

    stack.compose("start", "cloud")
    stack.wait_healthy("cloud")
    wait_until(
        lambda: held <= set(stack.python("cloud", RECEIVED, "edge-1")), "the held messages stored", timeout=WAIT_S
    )
    wait_until(lambda: not held & set(stack.python("edge", SPOOLED)), "the spool acknowledged", timeout=WAIT_S)
    stack.wait_healthy("edge")
    print(f"edge restarted after kill -9: {len(held)} spooled messages kept, all stored", file=sys.stderr)

    stack.down()
    stacks.remove(stack)


def test_an_edge_box_sends_to_a_cloud_on_the_host(
    engine: DockerEngine, images: Images, stacks: list[Stack], short_clip: Path, make_filter: Callable,
    tmp_path: Path,
) -> None:  # fmt: skip
    """deploy/compose.edge.yml with its replayed camera, sending to a cloud process on the host (bound to the box's
    network gateway), with the key exchange of docs/deploy.md."""
    require_free({5555, 5556})  # the cloud's, as deploy/compose/edge.yaml sends to them
    env = {"FF_EDGE_ID": "edge-2", "FF_CLIP": str(short_clip), "FF_CLOUD_ADDRESS": "cloud.invalid"}
    box = Stack(engine, EDGE_BOX, env, tmp_path / "box", "camera")
    stacks.append(box)
    edge_public_key = box.compose("run", "--rm", "-T", "keys").stdout  # ffe run --rm -T keys > edge-2.key
    gateway = engine.docker(
        "network", "inspect", "--format", "{{(index .IPAM.Config 0).Gateway}}", f"{box.name}_default"
    ).stdout.strip()
    assert gateway, "the box's network has no gateway"

    keys = tmp_path / "cloud-keys"
    created = subprocess.run(
        [sys.executable, "-m", "filterforward", "keys", "create", "cloud", "--dir", str(keys)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    (keys / "edges").mkdir()
    (keys / "edges" / "edge-2.key").write_text(edge_public_key)
    box.compose(
        "run", "--rm", "-T", "keys", "sh", "-c", "cat > /keys/cloud.key", input=(keys / "cloud.key").read_text()
    )

    zmq = {
        "bind": gateway, "ingest_port": 5555, "publish_port": 5556, "insecure": False,
        "secret_key": str(keys / "cloud.key_secret"), "edge_keys": str(keys / "edges"),
    }  # fmt: skip
    (tmp_path / "cloud").mkdir()
    with run_cloud(tmp_path / "cloud", zmq=zmq) as cloud:
        box.env["FF_CLOUD_ADDRESS"] = gateway
        box.compose("up", "--detach", "--no-build")
        box.wait_healthy("camera", "edge")
        with cloud.client(READ_WRITE) as api, cloud.client(READ_ONLY) as view:
            register_always_firing_filter(api, make_filter)
            wait_for_stored_frame(view, "edge-2", box)
        box.down()
        stacks.remove(box)
