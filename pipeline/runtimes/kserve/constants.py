"""Names the KServe runtime's modules share (kept out of the package face, which
imports the registry and its hooks: a module here importing the face would import
the whole runtime's registration to read one string)."""

from __future__ import annotations

NAME = "kserve"
CONFIG_FILE = "kserve.json"  # the runtime's config, on its command line: its marker
# The metrics key, beside inference_key.json; written and needed only off loopback.
METRICS_KEY_FILE = "metrics_key.json"
DEFAULT_GRPC_PORT = 8083  # not 8081 (KServe's own default), which TorchServe's management takes
