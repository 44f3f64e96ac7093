"""The cloud service's YAML configuration, validated strictly at load time (secrets via `${ENV}`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, create_model, field_validator, model_validator
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from cloud.notify import CHANNELS
from common import curve
from common.configfile import ConfigPath, FolderPath, parse_config, validate
from models.bundle import MAX_MODEL_BYTES

Scope = Literal["read", "write", "train"]  # train: a trainer service taking training jobs
DATABASES = ("sqlite", "postgresql")  # the backends the schema migrations and tests cover
POSTGRES_URL = "postgresql+psycopg://USER:PASSWORD@HOST/DB"


class TokenConfig(BaseModel):
    """A bearer token for the REST API; `write` implies nothing about `read`: list both for full access."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="who holds it (for logs)")
    token: str = Field(min_length=16, description="the secret; use ${ENV} rather than writing it here")
    scopes: list[Scope] = Field(default_factory=lambda: ["read"], min_length=1)

    @field_validator("token")
    @classmethod
    def _sendable(cls, value: str) -> str:
        """A space at either end (say, in .env) or a non-ASCII character made a token no request could match."""
        if not re.fullmatch(r"[!-~]+", value):
            raise ValueError(
                "a token can only hold printable ASCII characters with no spaces (an HTTP header carries no other): "
                "check for a space at its ends"
            )
        return value


class ZmqConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bind: str = Field("0.0.0.0", description="address the ingest and filter sockets bind")
    ingest_port: int = Field(5555, ge=0, le=65535, description="ROUTER for the edges' uplinks (0: any free port)")
    publish_port: int = Field(5556, ge=0, le=65535, description="PUB for filter updates (0: any free port)")
    secret_key: ConfigPath | None = Field(None, description="the cloud's CURVE secret key file (filterforward keys)")
    edge_keys: FolderPath | None = Field(None, description="folder of allowed edges' public key files (<edge>.key)")
    insecure: bool = Field(False, description="no CURVE: only for loopback tests and demos")
    heartbeat: float = Field(1.0, ge=0.05, le=60, description="seconds between heartbeats to each edge")
    edge_timeout: float = Field(5.0, gt=0, le=86_400, description="an edge silent this long is shown offline")

    @model_validator(mode="after")
    def _two_ports(self) -> ZmqConfig:
        if self.ingest_port and self.ingest_port == self.publish_port:
            raise ValueError(f"ingest_port and publish_port are both {self.ingest_port}: give each socket its own")
        return self

    @model_validator(mode="after")
    def _keys_or_insecure(self) -> ZmqConfig:
        if not self.insecure and (self.secret_key is None or self.edge_keys is None):
            raise ValueError(
                "set zmq.secret_key and zmq.edge_keys (create them with `filterforward keys`), "
                "or zmq.insecure: true for a loopback test"
            )
        return self

    def check_keys(self) -> None:
        """The cloud's key file reads as a keypair (one line when not), for `config check`; serving reads it too."""
        if not self.insecure:
            curve.load_keypair(self.secret_key)


class RetentionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_age_days: float | None = Field(30.0, gt=0, le=36_500, description="delete frames and clips older than this")
    max_bytes: int | None = Field(50 * 2**30, gt=0, description="delete the oldest payloads above this total")
    interval: float = Field(60.0, gt=0, le=86_400, description="seconds between retention sweeps")


class TrainingConfig(BaseModel):
    """Training jobs (docs/studio.md): how long a trainer holds a job between progress reports."""

    model_config = ConfigDict(extra="forbid")

    lease: float = Field(
        60.0, gt=0, le=86_400, description="seconds a running job stays with a trainer that stops reporting"
    )
    attempts: int = Field(3, ge=1, le=100, description="claims of a job whose trainers all died before it fails")


def notification_keys() -> type[BaseModel]:
    """A model with one key per notification channel type (mqtt, webhooks), holding the settings it takes."""
    return create_model("Notifications", **{channel.name: channel.field for channel in CHANNELS.values()})


class CloudConfig(notification_keys()):
    model_config = ConfigDict(extra="forbid")

    data_dir: FolderPath = Field(
        Path("filterforward-cloud"), validate_default=True, description="frame store and the default SQLite file"
    )
    database_url: str | None = Field(None, description="SQLAlchemy URL; default SQLite in data_dir")
    host: str = Field("127.0.0.1", description="HTTP bind address")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port")
    public_url: HttpUrl | None = Field(None, description="base URL of this service in notifications")
    tokens: list[TokenConfig] = Field(min_length=1)
    zmq: ZmqConfig
    retention: RetentionConfig = RetentionConfig()
    training: TrainingConfig = TrainingConfig()
    max_upload_bytes: int = Field(
        MAX_MODEL_BYTES,
        gt=0,
        le=MAX_MODEL_BYTES,
        description="limit on an uploaded MC model (edges take at most 16 MiB)",
    )

    @field_validator("tokens")
    @classmethod
    def _distinct_tokens(cls, tokens: list[TokenConfig]) -> list[TokenConfig]:
        """A secret listed twice would take the scopes of its last entry only; a name twice makes the logs ambiguous."""
        names = [token.name for token in tokens]
        if (twice := _repeated(names)) is not None:
            raise ValueError(f"the token name {names[twice]!r} is given twice: give each token its own name")
        secrets = [token.token for token in tokens]
        if (twice := _repeated(secrets)) is not None:
            first = secrets.index(secrets[twice])
            raise ValueError(f"tokens {names[first]!r} and {names[twice]!r} have the same secret: give each its own")
        return tokens

    @model_validator(mode="after")
    def _http_port_free(self) -> CloudConfig:
        wildcards = {"0.0.0.0", "::", "*", ""}
        shared = self.host == self.zmq.bind or {self.host, self.zmq.bind} & wildcards
        for key in ("ingest_port", "publish_port"):
            if shared and getattr(self.zmq, key) == self.port:
                raise ValueError(
                    f"port (or --port) and zmq.{key} are both {self.port}: give the HTTP server its own port"
                )
        return self

    @field_validator("database_url", "public_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """`${FF_DATABASE_URL:-}` left empty means the default (SQLite in data_dir; links to host:port)."""
        return value or None

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, url: str | None) -> str | None:
        if url is None:
            return None
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise ValueError(f"not a database URL: write {POSTGRES_URL}") from None
        if parsed.get_backend_name() not in DATABASES:
            raise ValueError(
                f"{parsed.get_backend_name()} is not supported: use {POSTGRES_URL}, or leave database_url out for "
                "SQLite in data_dir"
            )
        try:
            parsed.get_dialect().import_dbapi()
        except (ArgumentError, ImportError):
            raise ValueError(f"the driver {parsed.drivername} is not installed: use {POSTGRES_URL}") from None
        return url

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'filterforward.db'}"

    @property
    def base_url(self) -> str:
        return str(self.public_url or f"http://{self.host}:{self.port}").rstrip("/")


def _repeated(values: list[str]) -> int | None:
    """The index of the first value that an earlier one equals, or None."""
    return next((i for i, value in enumerate(values) if value in values[:i]), None)


def load_cloud_config(path: Path, overrides: Mapping[str, object] | None = None) -> CloudConfig:
    """Read and validate a cloud YAML file, top-level keys replaced by `overrides` (the command line's, validated
    with the rest: a --port that is zmq's ingest port is refused as the same key in the file is); relative paths
    in it are relative to the file."""
    document = parse_config(path)
    return validate(replace(document, data={**document.data, **(overrides or {})}), CloudConfig)
