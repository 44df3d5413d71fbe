"""The serve contract, against every registered runtime (the toy included): a runtime
honours every shared `pipeline serve` option or refuses it; none is silently dropped.

Each runtime starts one real server from options parsed as `pipeline serve` parses
them, every shared option given. The check is twofold: the runtime read each shared
option it does not refuse (`ServeOptions` notes what was read), and what can be seen
from outside holds: the port it was given answers, and a body one byte over the
given `--max-request-size` gets a 413 (the default limit is 64 times larger).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pipeline.cli import build_parser
from pipeline.cli import main as cli_main
from pipeline.export import ExportConfig, export
from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
from pipeline.serving import runtime
from pipeline.serving.client import auth_headers
from pipeline.serving.launcher import free_port, stop
from pipeline.serving.runtime import SHARED_OPTIONS, ServeOptions
from tests import toy_runtime

LIMIT = 64 * 1024  # --max-request-size for every runtime here


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifacts tree holding a digits export, and a store with its ONNX archive.

    The contract is about options, not weights: the CNN's seeded random weights, ONNX
    only (a few seconds), so that `make test-fast` needs neither the session's training
    nor its `.pt2` compile."""
    root = tmp_path_factory.mktemp("contract")
    export(
        ExportConfig(
            model="digits_lenet",
            random_init=True,
            checkpoint=root / "checkpoint.pt",
            out_dir=root / "digits_lenet" / "export",
            formats=("onnx",),
        )
    )
    archive(
        ArchiveConfig(
            model="digits_lenet",
            export_dir=root / "digits_lenet" / "export",
            store=root / "store",
            formats=("onnx",),
        )
    )
    return root


@pytest.fixture(scope="module")
def toy() -> Iterator[runtime.Runtime]:
    with toy_runtime.registered() as rt:
        yield rt


def _own_args(name: str, artifacts: Path) -> list[str]:
    """The runtime's own options a test server needs (free ports, one small worker)."""
    ports = {
        "torchserve": ["--management-port",
                       str(free_port()), "--metrics-port", str(free_port())],
        "kserve": ["--grpc-port", str(free_port()), "--format", "onnx", "--workers", "1"],
        "ray": ["--ray-format", "onnx", "--ray-node-cpus", "1"],  # a one-node local cluster
    }  # fmt: skip
    return ports.get(name, [])


def options_for(name: str, artifacts: Path, run_dir: Path) -> ServeOptions:
    """`pipeline serve --runtime NAME` with every shared option given, parsed by the CLI."""
    argv = [
        "--artifacts-dir", str(artifacts), "serve", "--runtime", name, "--model", "digits_lenet",
        "--host", "127.0.0.1", "--port", str(free_port()), "--max-request-size", str(LIMIT),
        "--threads-per-worker", "1", "--run-dir", str(run_dir), "--store", str(artifacts / "store"),
        *_own_args(name, artifacts),
    ]  # fmt: skip
    args = build_parser().parse_args(argv)
    own = [a.dest for a in args.runtime_options[name]]
    return ServeOptions.from_args(args, run_dir, own)


def contract_problems(rt: runtime.Runtime, options: ServeOptions) -> list[str]:
    """What `rt` did wrong with `options`, serving them for real (stopped after)."""
    server = rt.serve(options)
    try:
        # Before this test reads any option itself (reading counts).
        problems = [
            f"{rt.name} ignored --{o.replace('_', '-')}"
            for o in options.unread()
            if o not in rt.refuses
        ]
        if not server.inference_url.endswith(f":{options.port}"):
            problems.append(f"{rt.name} serves on {server.inference_url}, not port {options.port}")
        name = server.models[0]
        r = httpx.post(
            server.inference_url + rt.protocol.infer_path(name),
            content=b"[" + b"0," * (LIMIT // 2) + b"0]",  # one byte over LIMIT
            headers={**auth_headers(server, "inference"), "Content-Type": "application/json"},
            timeout=30,
        )
        if r.status_code != 413:
            problems.append(f"{rt.name} answered {r.status_code}, not 413, over --max-request-size")
        return problems
    finally:
        stop(options.run_dir)


@pytest.mark.parametrize("name", [*runtime.BUILTIN, toy_runtime.NAME])
def test_every_runtime_honours_every_shared_option(
    name: str, toy: runtime.Runtime, artifacts: Path, tmp_path: Path
) -> None:
    rt = runtime.get(name)
    assert contract_problems(rt, options_for(name, artifacts, tmp_path / "run")) == []


def test_a_refused_shared_option_is_an_error_before_anything_starts(
    toy: runtime.Runtime, artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert set(toy.refuses) <= set(SHARED_OPTIONS) and toy.refuses
    code = cli_main([
        "--artifacts-dir", str(artifacts), "serve", "--runtime", toy.name,
        "--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"),
        "--port", str(free_port()), "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "the toy runtime does not take --tls-cert: it serves plain HTTP only" in err
    assert not (tmp_path / "run" / "server.json").exists()


class Careless(toy_runtime.Toy):
    """The toy, starting its server without the body limit it was given."""

    def serve(self, options: ServeOptions) -> object:
        exports = [(e.dir, e.manifest, "onnx") for e in options.exports("digits_lenet")]
        return toy_runtime.start(exports, options.run_dir, options.port, host=options.host,
                                 threads=options.threads_per_worker)  # fmt: skip


def test_the_contract_check_can_fail(toy: runtime.Runtime, artifacts: Path, tmp_path: Path) -> None:
    problems = contract_problems(Careless(), options_for(toy.name, artifacts, tmp_path / "run"))
    assert problems == [
        "toy ignored --max-request-size",
        "toy answered 400, not 413, over --max-request-size",
    ], problems
