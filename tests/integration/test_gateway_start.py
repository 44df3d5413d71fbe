"""`pipeline serve` waits for *its* gateway: another server on the gateway's port is not
taken for it (a CI run's serve returned 0 with the gateway dead and TorchServe's gRPC
server on the port, and every request got HTTP/2 back)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from pipeline.runtimes.torchserve.launch import ServeConfig, _start_gateway
from pipeline.serving.server import ServeError, Server


def test_a_gateway_that_cannot_bind_is_an_error_even_if_the_port_answers(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "key_file.json").write_text("{}")
    with socket.socket() as other:  # "another server": it accepts connections on the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        server = Server(
            runtime="torchserve", pid=os.getpid(), run_dir=str(tmp_path),
            inference_url=f"http://127.0.0.1:{port}", metrics_url="", models=[],
            extras={"backend_url": "http://127.0.0.1:9"},
        )  # fmt: skip
        config = ServeConfig(store=tmp_path, run_dir=tmp_path, inference_port=port)
        with pytest.raises(ServeError, match=r"The gateway exited with status 1"):
            _start_gateway(server, config, tmp_path)
    log = (tmp_path / "logs" / "gateway.log").read_text()
    assert "Address already in use" in log or "address already in use" in log, log
