"""Bearer-token auth for the REST API: `Depends(require("read"))` or `require("write")` on a route."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cloud.config import Scope, TokenConfig

log = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="a token from the cloud config's `tokens` list")


def require(*scopes: Scope) -> Callable[..., TokenConfig]:
    """A dependency that admits a request only with a known bearer token that has one of `scopes`."""

    def check(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> TokenConfig:
        if credentials is None:
            raise _unauthorized("missing bearer token: send the header 'Authorization: Bearer <token>'")
        token = find_token(request.app.state.config.tokens, credentials.credentials)
        if token is None:
            log.warning("refused a request to %s with an unknown token", request.url.path)
            raise _unauthorized("unknown token: use one listed in the cloud config's tokens")
        if not set(scopes) & set(token.scopes):
            wanted = " or ".join(f"'{scope}'" for scope in scopes)
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"token '{token.name}' lacks the {wanted} scope: use a token that has it"
            )
        return token

    return check


def find_token(tokens: list[TokenConfig], presented: str) -> TokenConfig | None:
    """The token matching `presented`; every token is compared in constant time so timing reveals nothing."""
    presented_bytes = presented.encode()
    found = None
    for token in tokens:
        if hmac.compare_digest(token.token.encode(), presented_bytes):
            found = token
    return found


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})
