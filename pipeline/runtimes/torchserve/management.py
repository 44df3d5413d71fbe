"""TorchServe's management API (loopback, the management key): the runtime's own calls."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx

from pipeline.runtimes.torchserve.constants import KEY_FILE
from pipeline.serving.client import auth_headers
from pipeline.serving.server import Server

MANAGEMENT = "management"  # the key's API name in TorchServe's key file


def management_headers(server: Server) -> dict[str, str]:
    """The management key's Authorization header. A server.json written before servers
    recorded their key files (`Server.key_files`) names none: TorchServe's own file then,
    as it was."""
    if MANAGEMENT not in server.key_files:
        server = replace(server, key_files={**server.key_files, MANAGEMENT: KEY_FILE})
    return auth_headers(server, MANAGEMENT)


def management(
    server: Server,
    method: str,
    path: str,
    *,
    params: dict[str, Any] | None = None,
    timeout: float = 10.0,
) -> httpx.Response:
    """A call to TorchServe's management API (loopback) with the management token.

    httpx errors pass through: callers polling a starting server expect them.
    """
    return httpx.request(
        method,
        f"{server.extras['management_url']}{path}",
        params=params,
        headers=management_headers(server),
        timeout=timeout,
    )


def workers(server: Server, archive: str) -> list[dict[str, Any]] | None:
    """TorchServe's worker records for `archive` (pid, status, gpu, ...); None if not served."""
    resp = management(server, "GET", f"/models/{archive}")
    if resp.status_code != 200:
        return None
    return list(resp.json()[0].get("workers", []))
