"""Reading a YAML configuration file into a strict pydantic model: `${ENV}` substitution, one-line errors.

Shared by the edge's and the cloud's configuration (the cloud may import edge's light modules; never the
reverse).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from models.errors import FilterForwardError

Config = TypeVar("Config", bound=BaseModel)
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def read_config(path: Path, model: type[Config]) -> Config:
    """Validate the YAML file `path` as `model`; `${NAME}` / `${NAME:-default}` take environment values."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FilterForwardError(f"config file {path} does not exist") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FilterForwardError(f"config file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    try:
        return model.model_validate(substitute_env(raw or {}, path))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise FilterForwardError(f"config file {path}: {where}: {first['msg']}") from None


def substitute_env(value: Any, path: Path) -> Any:
    """`value` with `${NAME}` replaced in every string inside it (after parsing, so comments are left alone)."""
    if isinstance(value, dict):
        return {key: substitute_env(item, path) for key, item in value.items()}
    if isinstance(value, list):
        return [substitute_env(item, path) for item in value]
    return _substitute(value, path) if isinstance(value, str) else value


def _substitute(text: str, path: Path) -> str:
    def value(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise FilterForwardError(f"config file {path} uses ${{{name}}} but the environment has no {name}: set it")

    return _ENV.sub(value, text)


def resolve(path: Path, base: Path) -> Path:
    """A config path: relative paths are relative to the config file's folder."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else base / path
