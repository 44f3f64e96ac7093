"""The filter registry over REST, against a real `filterforward cloud serve` process (SQLite and PostgreSQL).

Every refusal is checked three ways: the HTTP status, a one-line detail that says what is wrong, and a
database (read directly, not through the API) exactly as it was before the request.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from cloud_server import MAX_UPLOAD, READ_ONLY, WRITE_ONLY, CloudServer, run_cloud_on
from sqlalchemy import event, select
from support import beat_from_two_processes, wait_until

from cloud.config import CloudConfig
from cloud.db import Filter, FilterChange, make_engine, session_factory
from cloud.registry import Registry
from common.protocol import Heartbeat, Hello, encode
from models.filterspec import MAX_VERSION, BaseModelId, FilterSpec

SIZE = (128, 96)

Exporter = Callable[..., tuple[FilterSpec, bytes]]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cloud(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    with run_cloud_on(request.param, tmp_path_factory.mktemp(f"cloud-{request.param}")) as server:
        yield server


@pytest.fixture(scope="module")
def models(make_filter: Exporter) -> dict[str, tuple[FilterSpec, bytes]]:
    """Real exported MCs: two for the late tap at 128x96, and misfits for it (mid tap, other input size)."""
    return {
        "late": make_filter("full_frame", "late", SIZE, name="late-a"),
        "late-other": make_filter("full_frame", "late", SIZE, name="late-b"),
        "mid": make_filter("full_frame", "mid", SIZE, name="mid"),
        "small": make_filter("full_frame", "late", (64, 64), name="small"),
    }


def db_state(config: CloudConfig) -> list[tuple]:
    """Every filter (with a digest of its model) and every filter change, straight from the database."""
    engine = make_engine(config.db_url)
    try:
        with session_factory(engine)() as session:
            filters = [
                (row.name, row.spec, row.revision, hashlib.sha256(row.onnx).hexdigest(), row.updated_at)
                for row in session.scalars(select(Filter).order_by(Filter.name))
            ]
            changes = [
                (row.version, row.name, row.action)
                for row in session.scalars(select(FilterChange).order_by(FilterChange.version))
            ]
    finally:
        engine.dispose()
    return [*filters, *changes]


def changes(config: CloudConfig) -> list[tuple[int, str, str]]:
    return [row for row in db_state(config) if isinstance(row[0], int)]


def upload(spec: FilterSpec | str, onnx: bytes | None) -> dict[str, Any]:
    text = spec if isinstance(spec, str) else spec.model_dump_json()
    files = {"model": ("model.onnx", onnx, "application/octet-stream")} if onnx is not None else None
    return {"data": {"spec": text}, "files": files}


def spec_for(name: str, **fields: Any) -> FilterSpec:
    return FilterSpec(name=name, architecture="full_frame", tap="late", input_size=SIZE, **fields)


def spec_json(**fields: Any) -> str:
    """The JSON of a valid spec named x with some fields replaced, unchecked (for specs the model refuses)."""
    return json.dumps({**spec_for("x").model_dump(mode="json"), **fields})


def test_create_list_get_and_download(cloud: CloudServer, models: dict) -> None:
    _, onnx = models["late"]
    spec = spec_for("cars-create", event="car", cameras=["cam-1"])
    with cloud.client() as client:
        created = client.post("/api/filters", **upload(spec, onnx))
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["name"] == "cars-create"
        assert body["spec"] == spec.model_dump(mode="json")
        assert body["model_bytes"] == len(onnx)
        assert body["created_at"] == body["updated_at"]

        listed = client.get("/api/filters").json()
        assert body in listed
        assert client.get("/api/filters/cars-create").json() == body
        model = client.get("/api/filters/cars-create/model")
        assert model.status_code == 200
        assert model.content == onnx
        assert model.headers["content-type"] == "application/octet-stream"
    # The change log has the creation as its newest entry, and the filter's revision is that version.
    assert changes(cloud.config)[-1] == (body["revision"], "cars-create", "put")


def test_update_bumps_version_and_revision(cloud: CloudServer, models: dict) -> None:
    _, onnx = models["late"]
    _, other = models["late-other"]
    with cloud.client() as client:
        first = client.post("/api/filters", **upload(spec_for("cars-update"), onnx)).json()

        smoother = spec_for("cars-update", smoothing={"threshold": 0.7, "k": 2, "n": 4})
        updated = client.put("/api/filters/cars-update", **upload(smoother, None))
        assert updated.status_code == 200, updated.text
        second = updated.json()
        assert second["spec"]["version"] == first["spec"]["version"] + 1
        assert second["spec"]["smoothing"] == {"threshold": 0.7, "k": 2, "n": 4}
        assert second["revision"] > first["revision"]
        assert second["created_at"] == first["created_at"]
        assert client.get("/api/filters/cars-update/model").content == onnx  # the model is kept

        third = client.put("/api/filters/cars-update", **upload(smoother, other)).json()
        assert third["spec"]["version"] == first["spec"]["version"] + 2
        assert third["revision"] > second["revision"]
        assert client.get("/api/filters/cars-update/model").content == other
    assert changes(cloud.config)[-2:] == [
        (second["revision"], "cars-update", "put"),
        (third["revision"], "cars-update", "put"),
    ]


def test_delete(cloud: CloudServer, models: dict) -> None:
    _, onnx = models["late"]
    with cloud.client() as client:
        assert client.post("/api/filters", **upload(spec_for("cars-delete"), onnx)).status_code == 201
        deleted = client.delete("/api/filters/cars-delete")
        assert deleted.status_code == 204
        assert deleted.content == b""
        missing = client.get("/api/filters/cars-delete")
        assert missing.status_code == 404
        assert "no filter named 'cars-delete'" in missing.json()["detail"]
        assert "cars-delete" not in [f["name"] for f in client.get("/api/filters").json()]
    assert changes(cloud.config)[-1][1:] == ("cars-delete", "delete")


def test_concurrent_changes_get_consecutive_versions(cloud: CloudServer, models: dict) -> None:
    _, onnx = models["late"]
    before = changes(cloud.config)
    statuses: list[int] = []

    def create(index: int) -> None:
        with cloud.client() as client:
            statuses.append(client.post("/api/filters", **upload(spec_for(f"burst-{index}"), onnx)).status_code)

    burst = 12  # more writers than the registry's retries: they must queue, not collide
    threads = [threading.Thread(target=create, args=(index,)) for index in range(burst)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [201] * burst
    after = changes(cloud.config)
    assert [version for version, _, _ in after] == list(range(1, len(after) + 1))  # no gap, no repeat
    assert sorted(name for _, name, _ in after[len(before) :]) == sorted(f"burst-{index}" for index in range(burst))


REFUSALS = [
    # (case, method, path, spec, model key or bytes, status, text in the detail)
    ("malformed spec JSON", "post", "/api/filters", '{"name": "x",', "late", 400, "spec is not valid JSON"),
    ("spec not an object", "post", "/api/filters", "[1, 2]", "late", 400, "send the filter spec as a JSON object"),
    (
        "unknown spec field",
        "post",
        "/api/filters",
        '{"name": "x", "architecture": "full_frame", "tap": "late", "input_size": [128, 96], "colour": "red"}',
        "late",
        422,
        "colour: Extra inputs are not permitted",
    ),
    (
        "bad name",
        "post",
        "/api/filters",
        spec_for("x").model_dump_json().replace('"x"', '"Bad Name!"'),
        "late",
        422,
        "name:",
    ),
    (
        "unknown tap",
        "post",
        "/api/filters",
        spec_for("x").model_dump_json().replace('"late"', '"deep"'),
        "late",
        422,
        "tap 'deep' is unknown",
    ),
    (
        "input size not a multiple of 32",
        "post",
        "/api/filters",
        spec_for("x").model_dump_json().replace("96", "100"),
        "late",
        422,
        "multiples of 32",
    ),
    ("model for another tap", "post", "/api/filters", spec_for("x").model_dump_json(), "mid", 422, "retrain the MC"),
    (
        "model for another input size",
        "post",
        "/api/filters",
        spec_for("x").model_dump_json(),
        "small",
        422,
        "retrain the MC",
    ),
    (
        "corrupt model",
        "post",
        "/api/filters",
        spec_for("x").model_dump_json(),
        b"\x08\x07not onnx at all",
        422,
        "not a valid ONNX file",
    ),
    ("empty model", "post", "/api/filters", spec_for("x").model_dump_json(), b"", 422, "not a valid ONNX file"),
    (
        "model just over the limit",
        "post",
        "/api/filters",
        spec_for("x").model_dump_json(),
        b"\0" * (MAX_UPLOAD + 1),
        413,
        "max_upload_bytes",
    ),
    (
        "huge upload",
        "post",
        "/api/filters",
        spec_for("x").model_dump_json(),
        b"\0" * (3 * 2**20),
        413,
        "max_upload_bytes",
    ),
    ("missing model", "post", "/api/filters", spec_for("x").model_dump_json(), None, 422, "body.model: Field required"),
    ("duplicate name", "post", "/api/filters", spec_for("existing").model_dump_json(), "late", 409, "already exists"),
    (
        "update of an unknown filter",
        "put",
        "/api/filters/nobody",
        spec_for("nobody").model_dump_json(),
        None,
        404,
        "no filter named 'nobody'",
    ),
    (
        "update of an unknown filter whose spec has another name",
        "put",
        "/api/filters/nobody",
        spec_for("other").model_dump_json(),
        None,
        404,
        "no filter named 'nobody'",
    ),
    (
        "rename by update",
        "put",
        "/api/filters/existing",
        spec_for("other").model_dump_json(),
        None,
        422,
        "cannot be renamed",
    ),
    (
        "update whose spec the kept model does not fit",
        "put",
        "/api/filters/existing",
        spec_for("existing").model_dump_json().replace('"late"', '"mid"'),
        None,
        422,
        "retrain the MC",
    ),
    (  # same box (the whole frame), so the crop fits: it was taken, and the edges kept matching the old region
        "update to another polygon without a model",
        "put",
        "/api/filters/existing",
        json.dumps(
            {
                **spec_for("existing").model_dump(mode="json"),
                "roi": {"polygon": [[0, 0], [1, 0], [1, 0.03], [0.03, 0.03], [0.03, 1], [0, 1]]},
            }
        ),
        None,
        422,
        "trained for another region polygon, which its model holds as its mask",
    ),
    (
        "update with a corrupt model",
        "put",
        "/api/filters/existing",
        spec_for("existing").model_dump_json(),
        b"junk",
        422,
        "not a valid ONNX file",
    ),
    ("delete of an unknown filter", "delete", "/api/filters/nobody", None, None, 404, "no filter named 'nobody'"),
    (  # the whole name was echoed: a 10 kB answer
        "a name far too long",
        "delete",
        "/api/filters/" + "n" * 5000,
        None,
        None,
        404,
        f"no filter named '{'n' * 64}…' (5000 characters; a name has at most 64): list the filters",
    ),
    ("event label too long", "post", "/api/filters", spec_json(event="e" * 129), "late", 422, "event: String should"),
    ("camera name too long", "post", "/api/filters", spec_json(cameras=["c" * 129]), "late", 422, "cameras.0:"),
    (  # it ran on no camera, silently: no edge's camera can have that name
        "camera name no edge can have",
        "post",
        "/api/filters",
        spec_json(cameras=["cam-1", "front/door"]),
        "late",
        422,
        "invalid filter spec: cameras: camera 'front/door' is no camera name an edge can have",
    ),
    (
        "event no dataset can have",
        "post",
        "/api/filters",
        spec_json(event="../../x"),
        "late",
        422,
        "invalid filter spec: event: event '../../x' is no event name a dataset can have",
    ),
    ("camera listed twice", "post", "/api/filters", spec_json(cameras=["*", "*"]), "late", 422, "'*' is listed twice"),
    (  # each name valid, but the edges drop a filter message this large: 201, and it never ran anywhere
        "cameras too many to reach the edges",
        "post",
        "/api/filters",
        spec_json(cameras=[f"c{n:04d}" + "x" * 59 for n in range(1024)]),  # 64 characters each
        "late",
        422,
        "byte message header, over their 65536-byte limit: list fewer cameras (or '*') or shorten its warnings",
    ),
    (  # the edge reads a base-DNN tap for it: a discrete (pixel) kind on one was a label that did not hold
        "kind whose tap it cannot read",
        "post",
        "/api/filters",
        spec_json(architecture="discrete"),
        "late",
        422,
        "invalid filter spec: spec: a discrete MC reads tap 'pixels', not tap 'late': fix the architecture",
    ),
    ("version too high", "post", "/api/filters", spec_json(version=2**31), "late", 422, "version: Input should"),
    (
        "polygon that crosses itself",
        "post",
        "/api/filters",
        spec_json(roi={"polygon": [[0, 0], [1, 1], [1, 0], [0, 1]]}),
        "late",
        422,
        "invalid filter spec: roi: the polygon crosses itself: list its points in order around the region",
    ),
    (
        "update past the highest version",
        "put",
        "/api/filters/at-max",
        spec_for("at-max").model_dump_json(),
        None,
        409,
        "at the highest version",
    ),
]


@pytest.fixture(scope="module")
def existing(cloud: CloudServer, models: dict) -> None:
    with cloud.client() as client:
        assert client.post("/api/filters", **upload(spec_for("existing"), models["late"][1])).status_code == 201
        at_max = spec_for("at-max", version=MAX_VERSION)
        assert client.post("/api/filters", **upload(at_max, models["late"][1])).status_code == 201


@pytest.mark.parametrize(
    ("method", "path", "spec", "model", "status", "detail"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_bad_input_is_refused_and_changes_nothing(
    cloud: CloudServer,
    models: dict,
    existing: None,
    method: str,
    path: str,
    spec: str | None,
    model: Any,
    status: int,
    detail: str,
) -> None:
    onnx = models[model][1] if isinstance(model, str) else model
    before = db_state(cloud.config)
    with cloud.client() as client:
        response = client.request(method, path, **(upload(spec, onnx) if spec is not None else {}))
    assert response.status_code == status, response.text
    message = response.json()["detail"]
    assert isinstance(message, str) and "\n" not in message
    assert detail in message
    assert db_state(cloud.config) == before


def test_a_form_part_sent_as_the_other_kind_says_which_it_takes(cloud: CloudServer, models: dict) -> None:
    """curl -F 'spec=@spec.json' uploads the spec as a file and -F 'model=<model.onnx' sends the model as text."""
    spec = spec_for("swapped").model_dump_json()
    before = db_state(cloud.config)
    with cloud.client() as client:
        spec_as_file = client.post("/api/filters", files={"spec": ("spec.json", spec), "model": models["late"][1]})
        model_as_text = client.post("/api/filters", data={"spec": spec, "model": "model.onnx"})
    assert (spec_as_file.status_code, spec_as_file.json()["detail"]) == (
        422,
        "body.spec: sent as a file, but it is a text field: send the file's text (curl -F 'spec=<FILE')",
    )
    assert (model_as_text.status_code, model_as_text.json()["detail"]) == (
        422,
        "body.model: sent as text, but it is a file: upload the file (curl -F 'model=@FILE')",
    )
    assert db_state(cloud.config) == before


def test_a_form_field_sent_twice_is_refused_not_one_copy_kept(cloud: CloudServer, models: dict) -> None:
    """Two model parts (a script's -F repeated) were accepted and one of them quietly registered."""
    spec = spec_for("twice").model_dump_json()
    onnx = models["late"][1]
    before = db_state(cloud.config)
    with cloud.client() as client:
        two_models = client.post(
            "/api/filters", data={"spec": spec}, files=[("model", ("a.onnx", onnx)), ("model", ("b.onnx", onnx))]
        )
        two_specs = client.post("/api/filters", data={"spec": [spec, spec]}, files={"model": ("m.onnx", onnx)})
        two_videos = client.post(
            "/api/datasets/upload",
            data={"name": "twice"},
            files=[("video", ("a.mp4", b"x")), ("video", ("b.mp4", b"y"))],
        )
    assert (two_models.status_code, two_models.json()["detail"]) == (
        422,
        "the form sent 'model' 2 times: send each field once",
    )
    assert (two_specs.status_code, two_specs.json()["detail"]) == (
        422,
        "the form sent 'spec' 2 times: send each field once",
    )
    assert two_videos.status_code == 422, two_videos.text
    assert db_state(cloud.config) == before
    with cloud.client() as client:
        assert client.get("/api/datasets/twice").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PATCH", "/api/filters", "GET, POST"),
        ("POST", "/api/filters/existing", "GET, PUT, DELETE"),
        ("POST", "/api/datasets", "GET"),
        ("OPTIONS", "/api/datasets/footage", "POST"),  # not GET/DELETE of /api/datasets/{name}, which it also fits
        ("POST", "/", "GET"),  # the web page: a route the API does not document
        ("PUT", "/api/events", "GET"),
    ],
)
def test_a_method_the_path_lacks_names_the_ones_it_has(
    cloud: CloudServer, method: str, path: str, allowed: str
) -> None:
    with cloud.client() as client:
        response = client.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allowed
    assert response.json()["detail"] == f"{method} is not allowed on {path}: use {allowed}"


def test_tokens_and_scopes(cloud: CloudServer, models: dict) -> None:
    spec, onnx = spec_for("scoped"), models["late"][1]
    before = db_state(cloud.config)
    with cloud.client(token=None) as anonymous:
        missing = anonymous.get("/api/filters")
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert "missing bearer token" in missing.json()["detail"]
        assert anonymous.post("/api/filters", **upload(spec, onnx)).status_code == 401
    with cloud.client(token="not-a-token-anyone-was-given") as stranger:
        unknown = stranger.get("/api/filters")
        assert unknown.status_code == 401
        assert "unknown token" in unknown.json()["detail"]
    with cloud.client(token=READ_ONLY) as viewer:
        assert viewer.get("/api/filters").status_code == 200
        refused = viewer.post("/api/filters", **upload(spec, onnx))
        assert refused.status_code == 403
        assert refused.json()["detail"] == "token 'viewer' lacks the 'write' scope: use a token that has it"
        assert viewer.delete("/api/filters/existing").status_code == 403
    with cloud.client(token=WRITE_ONLY) as uploader:
        assert uploader.get("/api/filters").status_code == 403
    assert db_state(cloud.config) == before


def test_open_endpoints_and_docs(cloud: CloudServer) -> None:
    with cloud.client(token=None) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/docs").status_code == 200
        document = client.get("/openapi.json").json()
        paths = document["paths"]
        assert {"/api/filters", "/api/filters/{name}", "/api/filters/{name}/model", "/api/events"} <= set(paths)
        assert "/static" not in paths
        ids = [operation["operationId"] for operations in paths.values() for operation in operations.values()]
        assert len(ids) == len(set(ids))  # GET and HEAD /healthz shared one: client generators refuse that
        assert client.head("/healthz").status_code == 200
        # Every refusal the API can answer under /api is documented with the one-line body it really has.
        assert document["components"]["schemas"]["ErrorOut"]["properties"] == {
            "detail": {"title": "Detail", "type": "string"}
        }
        assert "HTTPValidationError" not in document["components"]["schemas"]
        for path, operations in paths.items():
            for method, operation in operations.items():
                if path.startswith("/api/"):
                    assert {"401", "403", "422"} <= set(operation["responses"]), (method, path)
                for code, response in operation["responses"].items():
                    if code.startswith(("4", "5")):
                        schema = response["content"]["application/json"]["schema"]
                        assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (method, path, code)
        page = client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert client.get("/static/app.js").status_code == 200
        assert client.get("/static/no-such-file.js").status_code == 404
    with cloud.client() as client:
        unknown = client.get("/api/trainings")  # a path no route has: says where the paths are
        assert unknown.status_code == 404
        assert unknown.json() == {"detail": "no such path /api/trainings: the API's paths are listed at /docs"}
        known = client.get("/api/filters/nobody")  # an endpoint's own 404 keeps its detail
        assert known.status_code == 404 and known.json()["detail"].startswith("no filter named 'nobody'")


# -- base models: a filter must match the base model of every edge it targets -------------------------------

TRAINED = BaseModelId(name="effnet-lite0", precision="fp32", digest="0123456789abcdef")
INT8 = BaseModelId(name="effnet-lite0", precision="int8", digest="fedcba9876543210")


def say_hello(
    cloud: CloudServer,
    edge: str,
    cameras: list[str],
    base_model: BaseModelId | None,
    input_size: tuple[int, int] | None = None,
) -> None:
    """What an edge sends the cloud when it starts, over the real ingest socket; the heartbeat's answer comes
    after the hello is handled."""
    context = zmq.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{cloud.config.zmq.ingest_port}")
        hello = Hello(edge=edge, run="run-1", cameras=cameras, base_model=base_model, input_size=input_size)
        dealer.send_multipart(encode(hello))
        dealer.send_multipart(encode(Heartbeat(sender=edge)))
        assert dealer.poll(30_000), "the ingest did not answer"
    finally:
        context.destroy(linger=0)


def test_a_body_of_the_wrong_kind_is_named(cloud: CloudServer) -> None:
    """pydantic's words ("body.spec: Field required", "body.1: JSON decode error") did not say what was wrong."""
    with cloud.client() as client:
        as_json = client.post("/api/filters", json={"spec": {}})
        broken = client.post("/api/datasets/footage", content=b"{bad", headers={"Content-Type": "application/json"})
    assert (as_json.status_code, as_json.json()["detail"]) == (
        422,
        "body.spec: missing: this endpoint takes a multipart form (curl -F), not JSON",
    )
    assert broken.status_code == 422
    assert broken.json()["detail"].startswith("the body is not valid JSON (Expecting property name")


def test_two_edge_processes_with_one_edge_id_are_flagged(cloud: CloudServer) -> None:
    beat_from_two_processes(cloud.config.zmq.ingest_port, "edge-twin")
    with cloud.client() as client:
        assert client.get("/api/edges/edge-twin").json()["shared_id"] is True
        assert {edge["id"]: edge["shared_id"] for edge in client.get("/api/edges").json()}["edge-twin"] is True
    lines = [line for line in cloud.log_text().splitlines() if "two edge processes send as edge edge-twin" in line]
    assert len(lines) == 1, lines


def post_spec(
    client: httpx.Client, name: str, cameras: list[str], base_model: BaseModelId | None, onnx: bytes
) -> httpx.Response:
    return client.post("/api/filters", **upload(spec_for(name, cameras=cameras, base_model=base_model), onnx))


def when_said(detail: str) -> str:
    """The refusal with the time the edge last said its base model as {seen}."""
    return re.sub(r"said so last at \d{4}-\d\d-\d\d \d\d:\d\d UTC", "said so last at {seen} UTC", detail)


def test_a_filter_trained_on_another_base_model_than_a_target_edge_runs_is_refused(
    cloud: CloudServer, models: dict
) -> None:
    onnx = models["late"][1]
    say_hello(cloud, "edge-int8", ["bm-dock"], INT8)
    say_hello(cloud, "edge-quiet", ["bm-yard"], None)  # has not reported its base model: nothing to refuse
    detail = (
        "filter 'bm-dock' was trained on base model effnet-lite0 fp32 (digest 0123456789abcdef) but edge "
        "'edge-int8' runs effnet-lite0 int8 (digest fedcba9876543210) (it said so last at {seen} UTC): retrain it "
        "on that base model (--base-model of filterforward train or trainer serve), run the edge on the one it was "
        "trained on (filterforward models export, the edge's base_model:), or, if the edge is gone, forget it "
        "(DELETE /api/edges/edge-int8)"
    )
    before = db_state(cloud.config)
    with cloud.client() as client:
        for cameras in (["bm-dock"], ["*"]):
            refused = post_spec(client, "bm-dock", cameras, TRAINED, onnx)
            assert (refused.status_code, when_said(refused.json()["detail"])) == (409, detail)
        assert db_state(cloud.config) == before
        # Other cameras, the edge's own base model, none recorded: stored.
        for name, cameras, base_model in [
            ("bm-yard", ["bm-yard"], TRAINED),
            ("bm-int8", ["bm-dock"], INT8),
            ("bm-unrecorded", ["bm-dock"], None),
        ]:
            assert post_spec(client, name, cameras, base_model, onnx).status_code == 201, name
        # Moving a stored filter onto that edge's camera is refused the same way.
        before = db_state(cloud.config)
        moved = spec_for("bm-yard", cameras=["bm-yard", "bm-dock"], base_model=TRAINED)
        refused = client.put("/api/filters/bm-yard", **upload(moved, None))
        assert refused.status_code == 409
        assert when_said(refused.json()["detail"]) == detail.replace("'bm-dock'", "'bm-yard'", 1)
        assert db_state(cloud.config) == before
        conflict = client.get("/openapi.json").json()["paths"]["/api/filters"]["post"]["responses"]["409"]
        assert "another base model" in conflict["description"]


def test_an_edge_gone_for_good_is_forgotten_and_refuses_no_more_filters(cloud: CloudServer, models: dict) -> None:
    """An edge that last reported another base model refused every new filter for its cameras (every new studio
    filter targets all cameras) for ever, online or not, and nothing could remove it: DELETE was 405."""
    onnx = models["late"][1]
    say_hello(cloud, "edge-gone", ["gone-cam"], INT8)
    with cloud.client() as client:
        busy = client.delete("/api/edges/edge-gone")
        assert busy.status_code == 409 and busy.json()["detail"].startswith("edge 'edge-gone' is online"), busy.text
        wait_until(lambda: not client.get("/api/edges/edge-gone").json()["online"], "edge-gone shown offline")
        refused = post_spec(client, "for-gone", ["gone-cam"], TRAINED, onnx)
        assert refused.status_code == 409, refused.text
        assert refused.json()["detail"].endswith("or, if the edge is gone, forget it (DELETE /api/edges/edge-gone)")
        assert client.delete("/api/edges/edge-gone").status_code == 204
        assert client.get("/api/edges/edge-gone").status_code == 404
        assert "gone-cam" not in {camera["name"] for camera in client.get("/api/cameras").json()}
        assert post_spec(client, "for-gone", ["gone-cam"], TRAINED, onnx).status_code == 201
        assert client.delete("/api/edges/edge-gone").status_code == 404
    with cloud.client(READ_ONLY) as client:
        assert client.delete("/api/edges/edge-int8").status_code == 403


def test_an_edge_on_another_base_model_than_its_filters_is_logged_once_and_listed(
    cloud: CloudServer, models: dict
) -> None:
    onnx = models["late"][1]
    with cloud.client() as client:
        assert post_spec(client, "bm-gate", ["bm-gate"], TRAINED, onnx).status_code == 201
        say_hello(cloud, "edge-gate", ["bm-gate"], INT8)  # restarted on an int8 export
        edge = client.get("/api/edges/edge-gate").json()
        assert (edge["base_model"], edge["refused_filters"]) == (INT8.model_dump(), ["bm-gate"])
        listed = {edge["id"]: edge for edge in client.get("/api/edges").json()}
        assert listed["edge-gate"]["refused_filters"] == ["bm-gate"]
        lines = [line for line in cloud.log_text().splitlines() if "edge edge-gate runs base model" in line]
        assert len(lines) == 1, lines
        assert (
            "edge edge-gate runs base model effnet-lite0 int8 (digest fedcba9876543210), so its MC bank refuses "
            "filter(s) trained on another: bm-gate (effnet-lite0 fp32 (digest 0123456789abcdef)); retrain them on "
            "its base model or run the edge on theirs"
        ) in lines[0]
        # Retrained on the edge's base model: nothing refused any more.
        assert client.get("/api/filters/bm-gate").json()["refused_by"] == ["edge-gate"]
        retrained = spec_for("bm-gate", cameras=["bm-gate"], base_model=INT8)
        answer = client.put("/api/filters/bm-gate", **upload(retrained, None))
        assert (answer.status_code, answer.json()["refused_by"]) == (200, [])
        assert client.get("/api/edges/edge-gate").json()["refused_filters"] == []


def test_an_edge_listed_with_the_filters_trained_at_another_input_size_than_it_runs(
    cloud: CloudServer, models: dict
) -> None:
    """Its MC bank refuses them as it does another base model's; the registry stores them (a fleet's edges may run
    different sizes), and the edges' view says which edge refuses which."""
    onnx = models["late"][1]
    other = (SIZE[0] * 2, SIZE[1] * 2)
    with cloud.client() as client:
        assert post_spec(client, "size-gate", ["size-gate"], None, onnx).status_code == 201
        say_hello(cloud, "edge-small", ["size-gate"], None, SIZE)
        say_hello(cloud, "edge-large", ["size-gate"], None, other)
        # Every filter here is at SIZE: the large edge refuses each that targets it (this test's, and the module's
        # others for every camera), the small one none.
        targeting = sorted(
            f["name"] for f in client.get("/api/filters").json() if {"*", "size-gate"} & set(f["spec"]["cameras"])
        )
        assert "size-gate" in targeting
        listed = {edge["id"]: edge["refused_filters"] for edge in client.get("/api/edges").json()}
        assert (listed["edge-small"], listed["edge-large"]) == ([], targeting)
        assert client.get("/api/edges/edge-large").json()["refused_filters"] == targeting
        # The filter says it too: a new revision one edge refuses keeps the old one running there unseen.
        filters = {f["name"]: f["refused_by"] for f in client.get("/api/filters").json()}
        assert [filters[name] for name in targeting] == [["edge-large"]] * len(targeting)
        assert client.get("/api/filters/size-gate").json()["refused_by"] == ["edge-large"]
        again = client.put("/api/filters/size-gate", **upload(spec_for("size-gate", cameras=["size-gate"]), None))
        assert (again.status_code, again.json()["refused_by"]) == (200, ["edge-large"])


def test_listing_filters_reads_no_model_from_the_database(make_filter: Exporter, tmp_path: Path) -> None:
    """GET /api/filters read every filter's model to give its size: a hundred filters, up to 160 MB a request."""
    engine = make_engine(f"sqlite:///{tmp_path / 'cloud.db'}")
    registry = Registry(session_factory(engine), MAX_UPLOAD, on_change=lambda: None)
    spec, onnx = make_filter("full_frame", "late", (64, 64), name="listed")
    registry.create(spec, onnx)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cursor, statement, *_: statements.append(statement))
    [(row, size)] = registry.filters()
    assert (row.name, row.revision, size) == ("listed", 1, len(onnx))
    assert statements and not [s for s in statements if re.search(r"filters\.onnx(?!\))", s)], statements
    engine.dispose()
