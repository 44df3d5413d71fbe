"""TorchServe's keys: the inference key copied alone for clients (SECURITY.md, "Keys")."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core import fileio
from pipeline.runtimes.torchserve.constants import KEY_FILE
from pipeline.serving.server import INFERENCE_KEY_FILE, ServeError


def publish_inference_key(run_dir: Path) -> Path:
    """Keep TorchServe's key_file.json owner-only and copy its inference key alone to
    inference_key.json (0600 too: the owner decides whom to give it to).

    The management and API keys must not reach inference clients: with them
    anyone can scale workers or mint new keys, and TorchServe has no setting
    that closes scaling (`enable_model_api=false` only refuses register and
    delete, see SECURITY.md).
    """
    private = run_dir / KEY_FILE
    private.chmod(0o600)  # TorchServe sets rw------- itself; make sure of it
    try:
        inference = json.loads(private.read_text())["inference"]
    except (OSError, ValueError, KeyError) as err:
        raise ServeError(f"Cannot read TorchServe's token file {private}: {err}") from None
    return fileio.write_secret(run_dir / INFERENCE_KEY_FILE, {"inference": inference})
