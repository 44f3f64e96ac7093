"""The few REST calls a trainer makes to the cloud (docs/studio.md), with the standard library only."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from models.errors import FilterForwardError


class CloudError(FilterForwardError):
    """The cloud refused a request: its status and one-line detail."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class CloudUnreachable(FilterForwardError):
    """No answer from the cloud (down, restarting, the network): worth trying again later."""


def _is_http_url(url: str) -> bool:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 (raises ValueError for a port outside 0-65535 or not a number)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


class Cloud:
    """The few REST calls a trainer makes, with the standard library only (urllib), JSON in and out."""

    def __init__(self, url: str, token: str, timeout: float = 60.0) -> None:
        if not _is_http_url(url):
            raise FilterForwardError(f"cloud URL {url!r} is not http(s)://HOST[:PORT]: e.g. http://cloud:8000")
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = timeout
        self._answered = time.monotonic()  # when the cloud last answered (a refusal is an answer too)

    def silence(self, limit: float) -> str | None:
        """Why this trainer is unhealthy, or None: the cloud has not answered for over `limit` seconds."""
        silent = time.monotonic() - self._answered
        return f"no answer from the cloud at {self.url} for {silent:.0f} s" if silent > limit else None

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        form: dict[str, str] | None = None,
        files: dict[str, tuple[str, bytes]] | None = None,
    ) -> Any:
        """The JSON answer (None for 204); CloudError for a refusal, CloudUnreachable without an answer."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        elif form is not None or files is not None:
            data, headers["Content-Type"] = multipart(form or {}, files or {})
        with self._open(urllib.request.Request(self.url + path, data, headers, method=method)) as response:
            content = response.read()
            return json.loads(content) if response.status != 204 and content else None

    def download(self, path: str, out: Path) -> int:
        """GET `path` into the file `out`; its size."""
        request = urllib.request.Request(self.url + path, headers=self._headers)
        with self._open(request) as response, out.open("wb") as file:
            shutil.copyfileobj(response, file, 1 << 20)
        return out.stat().st_size

    @contextlib.contextmanager
    def _open(self, request: urllib.request.Request) -> Iterator[Any]:
        what = f"{request.get_method()} {request.full_url}"
        try:
            response = urllib.request.urlopen(request, timeout=self._timeout)
        except urllib.error.HTTPError as exc:
            self._answered = time.monotonic()
            raise CloudError(exc.code, f"{what}: {exc.code} {_detail(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CloudUnreachable(
                f"cannot reach the cloud ({what}: {reason}): check --cloud and that it is up"
            ) from None
        self._answered = time.monotonic()
        with response:
            yield response


def _detail(error: urllib.error.HTTPError) -> str:
    """The cloud's one-line `detail`, else the status text."""
    try:
        return str(json.loads(error.read())["detail"])
    except (ValueError, KeyError, TypeError, OSError):
        return error.reason


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body and its content type."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
        parts.append(value.encode() + b"\r\n")
    for name, (filename, content) in files.items():
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        parts.append(head.encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"
