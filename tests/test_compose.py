"""docker-compose.yml and deploy/compose.edge.yml, proven without a Docker engine.

Both files validate against the Compose Specification's JSON schema (tests/data). Then every service runs its own
`command` with its own `environment` as a local process, the way compose would start it: container paths (volumes,
the mounted config files, the clip) map to folders under tmp_path, service host names to 127.0.0.1, ports stay as
declared. The services must find each other from what the files say, and a frame the camera serves must come out
matched and stored in the cloud.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema
import pytest
import yaml
from cloud_server import postgres_schema
from support import free_port, wait_until

from cloud.config import CloudConfig, load_cloud_config
from edge.config import EdgeConfig, load_edge_config

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
EDGE_BOX = REPO / "deploy" / "compose.edge.yml"
SCHEMA = Path(__file__).with_name("data") / "compose-spec.schema.json"
OPERATOR_TOKEN = "compose-test-operator-token-0123"
DASHBOARD_TOKEN = "compose-test-dashboard-token-4567"
TRAINER_TOKEN = "compose-test-trainer-token-8901"
# What an operator's .env holds for docker-compose.yml (FF_CLIP is added per test: the real clip).
ENV = {"FF_OPERATOR_TOKEN": OPERATOR_TOKEN, "FF_DASHBOARD_TOKEN": DASHBOARD_TOKEN, "FF_TRAINER_TOKEN": TRAINER_TOKEN}
FILTER = "compose-always"
WAIT_S = 120.0  # bounds every wait on a service; only a broken setup reaches it
_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


# -- reading compose files the way compose does ------------------------------------------------------------------


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution in every string: $VAR, ${VAR}, ${VAR:-default}, ${VAR-default},
    ${VAR:?error}, ${VAR?error} and $$ for a literal $."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        if match["escaped"]:
            return "$"
        if match["bare"]:
            return env.get(match["bare"], "")
        name, op, arg = match["name"], match["op"], match["arg"]
        present = name in env and (env[name] != "" or not (op or "").startswith(":"))
        if present:
            return env[name]
        if op and op.endswith("?"):
            pytest.fail(f"compose would refuse to start: {name}: {arg}")
        return arg if op else ""

    return _INTERPOLATION.sub(substitute, value)


def read_compose(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def seconds(duration: str) -> float:
    """A compose duration such as 30s, 1m30s or 500ms."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"{duration!r} is not a compose duration"
    return sum(float(number) * units[unit] for number, unit in parts)


def probe_url(service: dict[str, Any]) -> str:
    """The URL a service's health check fetches (the last argument of its CMD)."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", f"health check {test} should be an exec-form CMD"
    return test[-1]


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# -- services as local processes ---------------------------------------------------------------------------------


@dataclass
class Service:
    """One compose service of one project, run as a local process with its container paths mapped under `root`."""

    name: str
    spec: dict[str, Any]  # interpolated
    project: Project
    process: subprocess.Popen | None = None
    paths: dict[str, Path] = field(default_factory=dict)  # container path -> local path, longest first
    configs: dict[str, Path] = field(default_factory=dict)  # container path -> the mounted config file in the repo

    @property
    def log(self) -> Path:
        return self.project.root / "logs" / f"{self.project.name}-{self.name}.log"

    def log_tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else "(no output)"

    def mount(self) -> None:
        """Map every volume (a shared folder per named volume) and bind mount (a file or folder; config files are
        copied with their container paths mapped) to a local path."""
        paths: dict[str, Path] = {}
        for volume in self.spec.get("volumes", []):
            source, target = volume.split(":")[:2]
            bind = source.startswith((".", "/"))
            paths[target] = (self.project.folder / source).resolve() if bind else self.project.volume(source)
        self.configs = {target: source for target, source in paths.items() if source.suffix in (".yaml", ".yml")}
        for target in self.configs:
            paths[target] = self.project.root / "etc" / self.project.name / self.name / Path(target).name
        self.paths = dict(sorted(paths.items(), key=lambda item: -len(item[0])))
        for target, source in self.configs.items():
            self.paths[target].parent.mkdir(parents=True, exist_ok=True)
            self.paths[target].write_text(self.localize(source.read_text()))

    def localize(self, text: str) -> str:
        """Container paths -> their local paths; service host names in URLs -> 127.0.0.1."""
        for target, local in self.paths.items():
            text = re.sub(rf"(?<![\w./-]){re.escape(target)}(?![\w.-])", str(local), text)
        hosts = "|".join(map(re.escape, self.project.services))
        return re.sub(rf"(?:(?<=://)|(?<=@))(?:{hosts})(?=[:/]|$)", "127.0.0.1", text)

    def variables(self) -> dict[str, str]:
        """The service's `environment`, localized (a value that names a service is its host: 127.0.0.1)."""
        return {
            key: "127.0.0.1" if value in self.project.services else self.localize(str(value))
            for key, value in self.spec.get("environment", {}).items()
        }

    def environment(self) -> dict[str, str]:
        """This machine's environment without any FF_ variable, the venv first on PATH, then the service's own."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("FF_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONUNBUFFERED"] = "1"  # as the images set it
        return {**env, **self.variables()}

    def argv(self, command: list[str] | None = None) -> list[str]:
        return [self.localize(arg) for arg in (command or self.spec["command"])]

    def run(self, command: list[str] | None = None, stdin: bytes | None = None) -> bytes:
        """Run to completion (a one-shot, or `docker compose run SERVICE COMMAND`); its stdout."""
        result = subprocess.run(
            self.argv(command), input=stdin, capture_output=True, env=self.environment(), cwd=self.project.root,
            timeout=WAIT_S,
        )  # fmt: skip
        assert result.returncode == 0, f"{self.name} failed: {result.stderr.decode()}"
        return result.stdout

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, env=self.environment(), cwd=self.project.root
            )

    def healthy(self) -> bool:
        """Its health check command, run as compose would run it in the container."""
        if self.process is not None and self.process.poll() is not None:
            pytest.fail(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
        check = subprocess.run(
            self.argv(self.spec["healthcheck"]["test"][1:]), capture_output=True, env=self.environment(), timeout=30
        )
        return check.returncode == 0

    def stop(self) -> int | None:
        """SIGTERM, as `docker compose stop`, and the exit status within the stop grace period (None: it hung)."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=seconds(self.spec.get("stop_grace_period", "10s")))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None


class Project:
    """A compose file's services as local processes: `up` in dependency order, `down` in reverse, SIGTERM each."""

    def __init__(self, path: Path, env: dict[str, str], root: Path, profiles: tuple[str, ...] = ()) -> None:
        compose = interpolate(read_compose(path), env)
        self.name, self.folder, self.root = compose["name"], path.parent, root
        active = {
            name: spec
            for name, spec in compose["services"].items()
            if not spec.get("profiles") or set(spec["profiles"]) & set(profiles)
        }
        self.services = {name: Service(name, spec, self) for name, spec in active.items()}
        for service in self.services.values():
            service.mount()
        self.started: list[Service] = []
        self.completed: list[Service] = []

    def volume(self, name: str) -> Path:
        path = self.root / "volumes" / self.name / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def __getitem__(self, name: str) -> Service:
        return self.services[name]

    def up(self, *names: str) -> None:
        """Start `names` (default: all) after what they depend on, as `docker compose up --wait` would."""
        for name in names or tuple(self.services):
            self._up(self.services[name])
        for service in self.started:
            if "healthcheck" in service.spec:
                wait_until(service.healthy, f"{service.name} to pass its health check", timeout=WAIT_S)

    def _up(self, service: Service) -> None:
        if service in self.started or service in self.completed:
            return
        for name, need in service.spec.get("depends_on", {}).items():
            if name not in self.services:
                assert need.get("required") is False, f"{service.name} needs {name}, which is not in this setup"
                continue
            dependency = self.services[name]
            self._up(dependency)
            if need["condition"] == "service_healthy":
                wait_until(dependency.healthy, f"{name} to be healthy", timeout=WAIT_S)
            if need["condition"] == "service_completed_successfully":
                assert dependency in self.completed, f"{service.name} waits for {name}, which is no one-shot"
        if service.spec.get("restart") == "no":  # a one-shot: runs to completion before its dependents start
            service.run()
            self.completed.append(service)
        else:
            service.start()
            self.started.append(service)

    def down(self) -> None:
        """Stop the dependents first; every service must exit 0 within its stop grace period."""
        failures = []
        for service in reversed(self.started):
            code = service.stop()
            if code != 0:
                failures.append(f"{service.name} exited with {code} after SIGTERM:\n{service.log_tail()}")
        self.started.clear()
        assert not failures, "\n".join(failures)

    def kill(self) -> None:
        for service in self.started:
            if service.process is not None and service.process.poll() is None:
                service.process.kill()
                service.process.wait()


@contextmanager
def running(*projects: Project) -> Iterator[None]:
    """Kills whatever the projects still run when the block ends (after a failure; `down` stops them cleanly)."""
    try:
        yield
    finally:
        for project in projects:
            project.kill()


def declared_ports(project: Project) -> set[int]:
    """Every port the project's services listen on: published container ports and health-checked ports."""
    ports = {int(str(port).rsplit(":", 1)[-1]) for s in project.services.values() for port in s.spec.get("ports", [])}
    ports |= {urlsplit(probe_url(s.spec)).port for s in project.services.values() if "healthcheck" in s.spec}
    return ports - {None}


def require_free(ports: set[int]) -> None:
    for port in sorted(ports):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                pytest.fail(f"port {port} is in use here; the compose services run on their declared ports: free it")


# -- the cloud's REST API ----------------------------------------------------------------------------------------


def service_config(service: Service, target: str, loader: Callable[[Path], Any]) -> Any:
    """A service's config file (mounted at `target`) as the service reads it: mapped paths, its environment."""
    with pytest.MonkeyPatch.context() as patch:
        for key in [key for key in os.environ if key.startswith("FF_")]:
            patch.delenv(key)
        for key, value in service.variables().items():
            patch.setenv(key, value)
        return loader(service.paths[target])


def cloud_config(project: Project) -> CloudConfig:
    return service_config(project["cloud"], "/etc/filterforward/cloud.yaml", load_cloud_config)


def edge_config(project: Project) -> EdgeConfig:
    return service_config(project["edge"], "/etc/filterforward/edge.yaml", load_edge_config)


def cloud_api(project: Project, token: str) -> httpx.Client:
    base_url = f"http://127.0.0.1:{cloud_config(project).port}"
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def register_always_firing_filter(project: Project, edge: EdgeConfig, make_filter: Callable) -> None:
    """A real exported MC whose output bias makes it fire on every frame, at the edge's input size."""
    spec, onnx = make_filter("full_frame", "late", edge.input_size, name=FILTER, bias=10.0)
    with cloud_api(project, OPERATOR_TOKEN) as api:
        response = api.post(
            "/api/filters",
            data={"spec": spec.model_dump_json()},
            files={"model": ("model.onnx", onnx, "application/octet-stream")},
        )
    assert response.status_code == 201, response.text


def wait_for_stored_frame(project: Project, edge: EdgeConfig) -> dict[str, Any]:
    """The first event of the filter with a stored frame; its JPEG must be served."""
    with cloud_api(project, DASHBOARD_TOKEN) as api:

        def stored() -> bool:
            items = api.get("/api/events", params={"filter": FILTER}).json()["items"]
            return any(item["frames"] > 0 and item["thumbnail_url"] for item in items)

        wait_until(stored, "a matched frame stored in the cloud", timeout=WAIT_S)
        event = next(item for item in api.get("/api/events", params={"filter": FILTER}).json()["items"])
        jpeg = api.get(event["thumbnail_url"])
    assert jpeg.status_code == 200 and jpeg.content.startswith(b"\xff\xd8"), "the stored frame is no JPEG"
    assert (event["edge"], event["camera"]) == (edge.edge_id, edge.cameras[0].name)
    return event


# -- the files against the Compose Specification -----------------------------------------------------------------


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("path", [COMPOSE, EDGE_BOX], ids=lambda path: path.name)
def test_compose_files_follow_the_compose_specification(path: Path, validator: jsonschema.Draft7Validator) -> None:
    errors = [
        f"{'.'.join(map(str, error.path))}: {error.message}" for error in validator.iter_errors(read_compose(path))
    ]
    assert not errors, "\n".join(errors)


def test_the_schema_check_catches_a_misspelt_key(validator: jsonschema.Draft7Validator) -> None:
    compose = read_compose(COMPOSE)
    compose["services"]["edge"]["restart_policy"] = compose["services"]["edge"].pop("restart")
    with pytest.raises(jsonschema.ValidationError, match="restart_policy"):
        validator.validate(compose)


def test_docker_compose_accepts_both_files(tmp_path: Path) -> None:
    """`docker compose config` needs no engine, only the compose plugin."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("the docker compose plugin is not installed here")
    env = {**os.environ, **ENV, "FF_CLOUD_ADDRESS": "cloud.example", "FF_CLIP": str(tmp_path / "clip.mp4")}
    for path in (COMPOSE, EDGE_BOX):
        result = subprocess.run(
            ["docker", "compose", "-f", str(path), "--profile", "postgres", "--profile", "camera", "config", "-q"],
            capture_output=True, text=True, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, f"{path.name}: {result.stderr}"


# -- the files against each other and the services' configs ------------------------------------------------------


@pytest.mark.parametrize("path", [COMPOSE, EDGE_BOX], ids=lambda path: path.name)
def test_services_agree_on_ports_and_variables(path: Path, tmp_path: Path) -> None:
    """Every ${VAR} the config files use is set by the service's environment (or has a default), and every port
    one service uses is the one the other serves and the health check probes."""
    env = {**ENV, "FF_CLOUD_ADDRESS": "cloud.example", "FF_CLIP": str(tmp_path / "clip.mp4")}
    project = Project(path, env, tmp_path, profiles=("camera",))
    edge, camera = edge_config(project), project["camera"].spec["command"]
    assert urlsplit(probe_url(project["camera"].spec)).port == int(option(camera, "--port"))
    assert urlsplit(probe_url(project["edge"].spec)).port == edge.metrics_port
    assert edge.cameras[0].source == f"http://127.0.0.1:{option(camera, '--port')}/"  # the service `camera`
    if path == COMPOSE:
        cloud = cloud_config(project)
        assert urlsplit(probe_url(project["cloud"].spec)).port == cloud.port
        published = {int(port.rsplit(":", 1)[1]) for port in project["cloud"].spec["ports"]}
        assert published == {cloud.port, cloud.zmq.ingest_port, cloud.zmq.publish_port}
        assert edge.cloud is not None and edge.cloud.address == "127.0.0.1"  # the service `cloud`
        assert (edge.cloud.ingest_port, edge.cloud.publish_port) == (cloud.zmq.ingest_port, cloud.zmq.publish_port)
        trainer = project["trainer"].spec["command"]
        assert urlsplit(option(trainer, "--cloud")).hostname == "cloud"  # the service `cloud`
        assert urlsplit(option(trainer, "--cloud")).port == cloud.port
        assert urlsplit(probe_url(project["trainer"].spec)).port == int(option(trainer, "--health-port"))
        assert any(token.scopes == ["train"] for token in cloud.tokens)  # the trainer's FF_TRAINER_TOKEN


@pytest.mark.parametrize("path", [COMPOSE, EDGE_BOX], ids=lambda path: path.name)
def test_every_variable_a_config_reads_is_passed_and_every_one_passed_is_read(path: Path, tmp_path: Path) -> None:
    project = Project(path, {**ENV, "FF_CLOUD_ADDRESS": "cloud.example"}, tmp_path, profiles=("camera",))
    for service in project.services.values():
        configs = " ".join(source.read_text() for source in service.configs.values())
        read = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", configs))
        passed = set(service.spec.get("environment", {}))
        assert read <= passed, f"{service.name}: compose never passes {read - passed}, which its config reads"
        script = " ".join(service.spec["command"])
        unread = {name for name in passed - read if name not in script}
        assert not unread, f"{service.name}: compose passes {unread}, which neither its config nor command reads"


@pytest.mark.parametrize("path", [COMPOSE, EDGE_BOX], ids=lambda path: path.name)
def test_what_services_write_lands_in_volumes(path: Path, tmp_path: Path) -> None:
    """The frame store, the spool and the keys live in named volumes, not on a container's own disk (which every
    upgrade replaces)."""
    project = Project(path, {**ENV, "FF_CLOUD_ADDRESS": "cloud.example"}, tmp_path, profiles=("camera",))
    edge = edge_config(project)
    assert edge.cloud is not None and edge.cloud.secret_key is not None and edge.cloud.server_key is not None
    written = [edge.spool.path, edge.cloud.secret_key, edge.cloud.server_key]
    if path == COMPOSE:
        cloud = cloud_config(project)
        written += [cloud.data_dir, cloud.zmq.secret_key, cloud.zmq.edge_keys]
        written.append(Path(option(project["trainer"].argv(), "--work")))
    volumes = tmp_path / "volumes"
    assert all(Path(written_path).is_relative_to(volumes) for written_path in written), written


@pytest.mark.parametrize("path", [COMPOSE, EDGE_BOX], ids=lambda path: path.name)
def test_long_running_services_restart_check_health_and_stop_gracefully(path: Path) -> None:
    services = read_compose(path)["services"]
    for name, spec in services.items():
        if name == "keys":
            assert spec["restart"] == "no"  # a one-shot
            continue
        assert spec["restart"] == "unless-stopped", name
        assert seconds(spec["stop_grace_period"]) == 30, name
        assert "healthcheck" in spec, name


def test_the_postgres_profile_points_the_cloud_at_postgres(tmp_path: Path) -> None:
    url = "postgresql+psycopg://filterforward:secret@postgres:5432/filterforward"
    project = Project(COMPOSE, {**ENV, "FF_DATABASE_URL": url}, tmp_path, profiles=("postgres",))
    assert project["cloud"].spec["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert cloud_config(project).db_url == url.replace("@postgres:", "@127.0.0.1:")
    without = Project(COMPOSE, ENV, tmp_path / "sqlite")
    assert "postgres" not in without.services
    db_url = cloud_config(without).db_url
    assert db_url.startswith("sqlite:///") and "cloud-data" in db_url


# -- the services running: a matched frame end to end ------------------------------------------------------------


def test_all_in_one_compose_stores_a_matched_frame_from_the_replayed_camera(
    tmp_path: Path, short_clip: Path, make_filter: Callable, base_model: Path
) -> None:
    project = Project(COMPOSE, {**ENV, "FF_CLIP": str(short_clip)}, tmp_path)
    require_free(declared_ports(project))
    with running(project):
        project.up()  # keys (one-shot), cloud, camera, edge; each passes its own health check
        edge = edge_config(project)
        register_always_firing_filter(project, edge, make_filter)
        wait_for_stored_frame(project, edge)
        project.down()


def test_an_edge_box_sends_to_a_cloud_on_another_host(
    tmp_path: Path, short_clip: Path, make_filter: Callable, base_model: Path
) -> None:
    """The cloud from docker-compose.yml on PostgreSQL (FF_DATABASE_URL; the local server stands in for the postgres
    service), the edge box from deploy/compose.edge.yml with its replayed camera, and the key exchange of
    docs/deploy.md."""
    with postgres_schema() as database_url:
        site = Project(COMPOSE, {**ENV, "FF_DATABASE_URL": database_url}, tmp_path / "cloud-host")
        box_env = {"FF_CLOUD_ADDRESS": "127.0.0.1", "FF_EDGE_ID": "edge-2", "FF_CLIP": str(short_clip)}
        box = Project(EDGE_BOX, box_env, tmp_path / "edge-box", profiles=("camera",))
        require_free(declared_ports(site) | declared_ports(box))
        with running(site, box):
            site.up("cloud")
            edge_public_key = box["keys"].run()  # ffe run --rm -T keys > edge-2.key
            site["keys"].run(["sh", "-c", "cat > /keys/edges/edge-2.key"], stdin=edge_public_key)
            cloud_public_key = site["keys"].run(["cat", "/keys/cloud.key"])
            box["keys"].run(["sh", "-c", "cat > /keys/cloud.key"], stdin=cloud_public_key)

            box.up("camera", "edge")
            edge = edge_config(box)
            register_always_firing_filter(site, edge, make_filter)
            wait_for_stored_frame(site, edge)
            box.down()
            site.down()


# -- the replayed camera on its own ------------------------------------------------------------------------------


def camera_serve(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "filterforward", "camera", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S, cwd=REPO)


def test_a_clip_played_once_ends_the_camera(short_clip: Path) -> None:
    """--no-loop: the camera stops by itself at the end of the clip, with status 0."""
    result = camera_serve(str(short_clip), "--port", str(free_port()), "--no-loop", "--fps", "200")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["ready"]
    assert "has ended" in result.stderr


def test_a_looping_camera_logs_going_online_once(short_clip: Path, tmp_path: Path) -> None:
    """Each loop reopens the clip; a camera replaying a 30 s clip for months must not log a line every 30 s."""
    log_file = tmp_path / "camera.log"
    serve = ["-v", "camera", "serve", str(short_clip), "--port", str(free_port()), "--fps", "400"]
    with log_file.open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "filterforward", *serve], stderr=log, cwd=REPO)
    try:
        wait_until(lambda: log_file.read_text().count("edge.sources: clip: online") >= 3, "two loops", WAIT_S)
    finally:
        process.terminate()
        process.wait(timeout=WAIT_S)
    lines = log_file.read_text().splitlines()
    assert len([line for line in lines if "INFO edge.sources: clip: online" in line]) == 1, lines


def test_the_camera_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.mp4"
    result = camera_serve(str(missing), "--port", "8080")
    assert result.returncode == 2
    assert result.stderr.strip() == f"filterforward camera: error: source {missing} does not exist; check the path"
    not_video = tmp_path / "labels.csv"
    not_video.write_text("frame_index,car\n0,1\n")
    result = camera_serve(str(not_video), "--port", "8080")
    assert result.returncode == 2  # and nothing but our line: OpenCV's own warning about the file is not shown
    assert result.stderr.strip() == (
        f"filterforward camera: error: {not_video} can't be decoded as video; check that it is a video file that plays"
    )


@pytest.mark.parametrize("dockerfile", sorted((REPO / "deploy").glob("Dockerfile.*")), ids=lambda p: p.name)
def test_every_folder_a_dockerfile_copies_enters_the_build_context(dockerfile: Path) -> None:
    """.dockerignore admits only what it names: a package left out fails the image build, not this machine.
    `COPY . ` copies the whole admitted context, which must then hold every package pyproject.toml installs."""
    admitted = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line[:1] == "!"}
    copied = re.findall(r"^COPY (?!--)(\S+) ", dockerfile.read_text(), flags=re.MULTILINE)
    if "." in copied:
        packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
        copied = [source for source in copied if source != "."]
        copied += ["pyproject.toml", "README.md", *(name.rstrip("*") for name in packages["include"])]
    assert copied and not [source for source in copied if source not in admitted]
