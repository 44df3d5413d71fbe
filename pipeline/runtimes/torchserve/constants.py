"""Names the TorchServe runtime's modules share (kept out of the package face, which
registers the runtime: a module here reads these without importing it)."""

from __future__ import annotations

NAME = "torchserve"
CONFIG_PROPERTIES = "config.properties"  # TorchServe's own config: the launcher's marker
GATEWAY_CONFIG = "gateway.json"  # the gateway's: pipeline.runtimes.torchserve.gateway.CONFIG_FILE
# TorchServe's own key file: inference, management and the API key that mints new ones,
# mode 0600 (`enable_model_api=false` still lets the management key scale workers, so
# inference clients read serving.server.INFERENCE_KEY_FILE, which holds their key only).
KEY_FILE = "key_file.json"
# Inside every archive: its ServedInfo (pipeline.serving.provenance), what it holds.
ARCHIVE_INFO = "archive.json"
