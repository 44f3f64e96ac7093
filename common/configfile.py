"""Reading a YAML configuration file into a strict pydantic model: `${ENV}` substitution, one-line errors that
name the offending key and its line.

Shared by the edge's and the cloud's configuration.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ValidationError, ValidationInfo
from pydantic_core import ErrorDetails

from models.errors import FilterForwardError

Config = TypeVar("Config", bound=BaseModel)
Loc = tuple[str | int, ...]  # a key path: mapping keys and list indices
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MERGE_KEY = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class ConfigDocument:
    """A parsed YAML file: its data (with `${ENV}` substituted) and the line of every key and list item."""

    path: Path
    data: Any
    lines: dict[Loc, int]

    def error(self, loc: Loc, message: str) -> FilterForwardError:
        """`config file F, line L: key.path: message`, at the line of the deepest part of `loc` in the file."""
        line = next((self.lines[loc[:end]] for end in range(len(loc), 0, -1) if loc[:end] in self.lines), 1)
        return located_error(self.path, line, loc, message)


def read_config(path: Path, model: type[Config]) -> Config:
    """Validate the YAML file `path` as `model`; `${NAME}` / `${NAME:-default}` take environment values and
    relative paths (fields typed ConfigPath/FolderPath) are relative to the file's folder."""
    return validate(parse_config(path), model)


def parse_config(path: Path) -> ConfigDocument:
    """Parse `path` (a mapping at the top), note each key's line and substitute `${ENV}` in its values."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FilterForwardError(f"config file {path} does not exist: check the path") from None
    except IsADirectoryError:
        raise FilterForwardError(f"config file {path} is a folder: give the YAML file in it") from None
    except UnicodeDecodeError as exc:
        raise FilterForwardError(
            f"config file {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8 YAML"
        ) from None
    except OSError as exc:
        raise FilterForwardError(f"config file {path} can't be read ({exc.strerror}): check its permissions") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines = _key_lines(node, path) if node is not None else {}
        data = loader.construct_document(node) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise FilterForwardError(
            f"config file {path}, line {line}: the file is not valid YAML: {exc.problem}"
        ) from None
    except yaml.YAMLError as exc:
        raise FilterForwardError(f"config file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise located_error(path, 1, (), "the file must be a mapping of keys (key: value)")
    document = ConfigDocument(path, data, lines)
    return replace(document, data=_substitute_env(data, (), document))


def validate(document: ConfigDocument, model: type[Config]) -> Config:
    try:
        config = model.model_validate(document.data, context={"base": document.path.parent})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A misspelt required key is both unknown and missing: name the misspelling, which is what to fix.
        first = next((error for error in errors if _meant(error, model)), errors[0])
        raise document.error(first["loc"], _message(first, model)) from None
    if (loc := _bool_read_as_number(document.data, config, ())) is not None:
        raise document.error(loc, "should be a number, not true or false")
    return config


def _bool_read_as_number(raw: Any, parsed: Any, loc: Loc) -> Loc | None:
    """Where a YAML true/false became a number: pydantic's lax mode reads `fps: true` as 1 and `resolution:
    [true, true]` as 1x1 pixels, which then ran. Walks the file's data beside the validated config."""
    if isinstance(raw, bool):
        return None if isinstance(parsed, bool) else loc
    if isinstance(raw, dict):
        values = parsed if isinstance(parsed, dict) else getattr(parsed, "__dict__", {})
        pairs = [(key, value, values[key]) for key, value in raw.items() if key in values]
    elif isinstance(raw, list) and isinstance(parsed, list | tuple) and len(raw) == len(parsed):
        pairs = list(zip(range(len(raw)), raw, parsed, strict=True))
    else:
        return None
    return next(
        (found for key, value, read in pairs if (found := _bool_read_as_number(value, read, (*loc, key))) is not None),
        None,
    )


def located_error(path: Path, line: int, loc: Loc, message: str) -> FilterForwardError:
    return FilterForwardError(f"config file {path}, line {line}: {key_path(loc)}: {message}")


def key_path(loc: Loc) -> str:
    """("cameras", 0, "name") -> "cameras.0.name"."""
    return ".".join(str(part) for part in loc) or "(top level)"


# ---------------------------------------------------------------------------------------------------------
# Paths in a config are relative to the file


def resolve(path: Path, base: Path) -> Path:
    """A config path: relative paths are relative to the config file's folder."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else base / path


def _relative_to_file(value: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base")  # set when read from a file; models built in code keep their paths
    return resolve(value, base) if base is not None else value


def _not_a_file(value: Path) -> Path:
    if value.is_file():
        raise ValueError(f"{value} is a file; point it at a folder (it is created if missing)")
    return value


ConfigPath = Annotated[Path, AfterValidator(_relative_to_file)]
FolderPath = Annotated[Path, AfterValidator(_relative_to_file), AfterValidator(_not_a_file)]


# ---------------------------------------------------------------------------------------------------------
# Helpers


def _key_lines(root: yaml.Node, path: Path) -> dict[Loc, int]:
    """1-based line of every mapping key and list item below `root`; a key given twice in one block is an error."""
    lines: dict[Loc, int] = {}
    inside: set[int] = set()  # the nodes being walked: an alias to one of them would make the data endless

    def walk(node: yaml.Node, loc: Loc) -> None:
        if id(node) in inside:
            raise located_error(path, lines.get(loc, 1), loc, "an alias inside its own anchor; remove the loop")
        inside.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_KEY:
                    continue  # merged (<<) keys fall back to the line of the block that merges them
                child = (*loc, key.value)
                if child in lines:
                    message = f"given twice (first on line {lines[child]}); keep one"
                    raise located_error(path, key.start_mark.line + 1, child, message)
                lines[child] = key.start_mark.line + 1
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[(*loc, index)] = item.start_mark.line + 1
                walk(item, (*loc, index))
        inside.discard(id(node))

    walk(root, ())
    return lines


def _substitute_env(value: Any, loc: Loc, document: ConfigDocument) -> Any:
    """`value` with `${NAME}` replaced in every string inside it (after parsing, so comments are left alone)."""
    if isinstance(value, dict):
        return {key: _substitute_env(item, (*loc, key), document) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute_env(item, (*loc, index), document) for index, item in enumerate(value)]
    if not isinstance(value, str):
        return value

    def variable(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise document.error(
            loc, f"uses ${{{name}}} but the environment has no {name}; set it (or write ${{{name}:-default}})"
        )

    return _ENV.sub(variable, value)


def _message(error: ErrorDetails, model: type[BaseModel]) -> str:
    """pydantic's message, in the words of a config file."""
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, error["loc"][:-1])
        if not allowed:
            return "unknown key"
        meant = f" (did you mean {close}?)" if (close := _meant(error, model)) else ""
        return f"unknown key{meant}; the keys allowed here are: {', '.join(allowed)}"
    if error["type"] == "missing":
        return "required key is missing; add it"
    return error["msg"].removeprefix("Value error, ")


def _meant(error: ErrorDetails, model: type[BaseModel]) -> str | None:
    """For an unknown key, the allowed key it looks like a misspelling of, if any."""
    if error["type"] != "extra_forbidden":
        return None
    close = difflib.get_close_matches(str(error["loc"][-1]), _allowed_keys(model, error["loc"][:-1]), n=1)
    return close[0] if close else None


def _allowed_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """The keys of the model found at `loc` inside `model` (list indices pass through)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, str):
            field = current.model_fields.get(part) if current else None
            current = _model_in(field.annotation) if field else None
    return list(current.model_fields) if current else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `Model`, `Model | None` or `list[Model]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((found for arg in typing.get_args(annotation) if (found := _model_in(arg))), None)
