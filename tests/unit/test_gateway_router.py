"""Which TorchServe version the gateway sends an unversioned request to (versions.Router):
the live state's default for an archive of a store version, TorchServe's own default for
one that is none (its version is the archiver's "1.0": routing it to "1" was a 404)."""

from __future__ import annotations

from pipeline.runtimes.torchserve.versions import Router
from pipeline.serving import live


def test_an_archive_of_no_store_version_is_left_to_torchserve() -> None:
    router = Router(None)
    router.state = live.LiveState(
        0,
        {
            "digits_lenet_onnx": live.ModelVersions(
                {2: live.Loaded(2, "/store/digits_lenet/2", "onnx")}, 2
            ),
            "my_cell_ts": live.ModelVersions({1: live.Loaded(1, "", "torchscript")}, 1),
        },
    )
    assert router.route("digits_lenet_onnx", None) == "2"
    assert router.route("my_cell_ts", None) is None  # TorchServe's default version
    assert router.route("my_cell_ts", "1.0") == "1.0"  # asked for: sent as asked
    assert router.route("unknown", None) is None
