"""Names the TorchServe runtime's modules share (kept out of the package face, which
registers the runtime: a module here reads these without importing it)."""

from __future__ import annotations

NAME = "torchserve"
CONFIG_PROPERTIES = "config.properties"  # TorchServe's own config: the launcher's marker
GATEWAY_CONFIG = "gateway.json"  # the gateway's: pipeline.runtimes.torchserve.gateway.CONFIG_FILE
