"""Shared fixtures. Tests are marked unit/integration/e2e from their folder.

Every test writes under pytest's tmp_path; none depends on the working
directory or on another test's order.

`make test` runs the suite in pytest-xdist workers (whole files per worker): each
session fixture here is built once, by whichever worker needs it first, and loaded by
the others; each worker hands out ports from its own range (servers and the CLI
processes it starts inherit it through $PIPELINE_PORTS).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from filelock import FileLock

from pipeline.export import FORMATS, PRECISION_FORMATS, ExportConfig, ExportResult, export
from pipeline.formats import base as registry
from pipeline.train import TrainConfig, TrainResult, train
from tests import cli_fork, cpu_profile, timing

# The float32 formats a server runs: FORMATS but the on-device ones (ExecuTorch's .pte, which
# the digits CNN's `exported` holds and tests/integration/test_pte.py covers for the others).
SERVED_FORMATS = tuple(k for k in FORMATS if k in registry.served_keys())
# Likewise the reduced-precision ones (the int8 .pte is on-device too).
SERVED_PRECISION_FORMATS = tuple(k for k in PRECISION_FORMATS if k in registry.served_keys())

_FOLDER_MARKS = {"unit", "integration", "e2e"}
T = TypeVar("T")


def _worker_ports() -> None:
    """Give this xdist worker its own slice of the ports below the ephemeral range: a
    port one process picked as free but has not bound yet is invisible to another."""
    worker, count = (
        os.environ.get("PYTEST_XDIST_WORKER"),
        os.environ.get("PYTEST_XDIST_WORKER_COUNT"),
    )
    if not worker or not count or "PIPELINE_PORTS" in os.environ:
        return
    from pipeline.serving.launcher import port_range

    ports = port_range()
    size = len(ports) // int(count)
    start = ports.start + int(worker.removeprefix("gw")) * size
    os.environ["PIPELINE_PORTS"] = f"{start}-{start + size - 1}"


_worker_ports()


def _worker_threads() -> None:
    """One intra-op thread per xdist worker, in the worker and in every process it starts.

    `make test` runs cores + 1 workers, and each one's torch defaulted to a thread per
    core, as did the CLI runs they start: the CPU ran oversubscribed (a bf16 training test
    took 66 s in a full run against 1 s alone). The count goes into the environment that
    CLI subprocesses inherit as well as into this process's torch, so a test comparing an
    in-process run with a CLI run bit for bit compares two runs with the same thread count.
    Servers set their workers' threads themselves (OMP_NUM_THREADS from their config), and
    what measures speed passes its threads explicitly. An OMP_NUM_THREADS given to pytest
    is kept and used for both."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    threads = os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", threads)
    torch.set_num_threads(max(1, int(threads)))


_worker_threads()


def _lean_jvm() -> None:
    """TorchServe's frontend JVMs, every one the suite starts (through TorchServe's own
    launcher, which reads no JVM options of ours): the client compiler alone and the
    serial collector. A TorchServe start and stop took 2.1 s of the JVM's CPU time
    against 4.4 s with the JIT's optimising tier and G1's threads, on the 2-core machine
    whose CPU the suite saturates; the JVM prints the options it picked up (in
    TorchServe's log). Servers the tests start answer as before; `pipeline serve` outside
    the tests is unchanged. A JAVA_TOOL_OPTIONS given to pytest is kept."""
    os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


_lean_jvm()


def shared(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """`make(folder)`, once for all xdist workers (pytest-xdist's documented recipe): the
    first worker to ask builds it under the session's common temp folder and pickles the
    result; the others wait on the lock and load it. Without xdist, a plain build."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # pytest-N/, above every popen-gwK/
    done = root / f"{name}.pickle"
    with FileLock(str(done) + ".lock"):
        if done.is_file():
            return pickle.loads(done.read_bytes())
        folder = root / name
        if folder.exists():  # another worker's build failed: fail here with its real error
            shutil.rmtree(folder)
        folder.mkdir()
        value = make(folder)
        done.write_bytes(pickle.dumps(value))
        return value


# The longest files first (worker-seconds per file in a full run on the 2-core AMD EPYC,
# 2026-11-27: `make test-times`). `make test` hands whole files to its xdist workers in
# this order (--no-loadscope-reorder: xdist's default reorders files by their number of
# tests, which put every long one-test file, the README walkthrough among them, at the
# end, where one worker ran them alone for minutes). Longest first is the classic remedy
# for that tail. The first three start three different session builds at once (the
# digits exports; the detector; the control-flow family); files not named keep their
# order after these.
LONGEST_FILES = (
    "integration/test_formats.py",  # 338 s: exported, precision, recurrent, a TorchServe
    "integration/test_kserve_interop.py",  # 278 s: the detector first, then the rest
    "integration/test_kserve_runtime.py",  # 193 s: the family
    "integration/test_training_modes.py",  # 82 s alone: four torchrun starts, no shared fixture
    "e2e/test_walkthrough.py",  # 120 s: its own training, server and C++ build
    "integration/test_serving.py",  # 120 s
    "integration/test_stale_server.py",  # 102 s
    "integration/test_jit_refused.py",  # 100 s
    "integration/test_detection.py",  # 99 s (2026-11-28: it ran last, the run's tail)
    "integration/test_user_models.py",  # 97 s
    "integration/test_pt2.py",  # 93 s
    "integration/test_ray_runtime.py",  # ~55 s: a three-node Ray cluster, a node killed
    "e2e/test_cli.py",  # 92 s
    "integration/test_partial_export.py",  # 84 s
    "integration/test_reliability.py",  # 77 s
    "integration/test_recurrent.py",  # 73 s
    "integration/test_bench.py",  # 65 s
    "e2e/test_own_model.py",  # 52 s
    "integration/test_kserve_operations.py",  # 51 s
    "integration/test_toy_runtime.py",  # 48 s
    "integration/test_verify_scale.py",  # 47 s
    "integration/test_cpp_pt2.py",  # 45 s
    "integration/test_shadow.py",  # 45 s
    "integration/test_serving_edges.py",  # 42 s
    "integration/test_cpp_op_libraries.py",  # 40 s
    "integration/test_rollout.py",  # 38 s
    "integration/test_cpp_client.py",  # 35 s
    "integration/test_shadow_torchserve.py",  # 34 s
    "integration/test_localise.py",  # 31 s
    "integration/test_rollout_torchserve.py",  # 30 s
    "integration/test_precision.py",  # 29 s
    "integration/test_kserve_page.py",  # 26 s: the KServe page's example, its own server
    # 22 s, and first in `make test-fast` (the unit tests' files are all shorter).
    "integration/test_runtime_contract.py",
)


def _file_rank(item: pytest.Item) -> int:
    path = Path(item.fspath).as_posix()
    ranks = (i for i, f in enumerate(LONGEST_FILES) if path.endswith(f"tests/{f}"))
    return next(ranks, len(LONGEST_FILES))


def pytest_addoption(parser: pytest.Parser) -> None:
    cpu_profile.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    timing.register(config)
    cpu_profile.register(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_file_rank)  # stable: within a file, and among the rest, order is kept
    for item in items:
        folder = Path(item.fspath).parent.name
        if folder in _FOLDER_MARKS:
            item.add_marker(getattr(pytest.mark, folder))
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs CUDA; none on this machine"))


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """The default digits run (all default settings), trained once per session."""

    def make(folder: Path) -> TrainResult:
        out = folder / "digits_lenet" / "checkpoint.pt"
        return train(TrainConfig(out=out, progress=False, device="cpu"))

    return shared(tmp_path_factory, "trained", make)


@pytest.fixture(scope="session")
def two_versions(trained: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with digits_lenet versions 1 (the session's checkpoint) and 2 (seed 1),
    ONNX only, published. Shared by every xdist worker: copy it before changing it."""

    def make(folder: Path) -> Path:
        from pipeline.serving.publish import PublishConfig, publish_export

        second = train(TrainConfig(out=folder / "seed1" / "checkpoint.pt", seed=1, progress=False))
        for n, ckpt in enumerate((trained.checkpoint.path, second.checkpoint.path), start=1):
            out = folder / f"export{n}"
            export(ExportConfig(checkpoint=ckpt, out_dir=out, formats=("onnx",)))
            publish_export(
                PublishConfig("digits_lenet", export_dir=out, report=folder / f"parity{n}.json",
                              checkpoint=ckpt, store=folder / "store"),
                say=lambda _: None,
            )  # fmt: skip
        return folder / "store"

    return shared(tmp_path_factory, "two_versions", make)


@pytest.fixture(scope="session")
def exported(trained: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    """The digits CNN in every float32 format (TorchScript, ONNX, .pt2, .pte). Not the .pte
    where ExecuTorch is missing: `make venv` installs it, a GPU machine's own image lacks it
    (tests/run_gpu.sh), and tests/integration/test_pte.py fails loudly without it."""
    from pipeline.formats import pte

    def make(folder: Path) -> ExportResult:
        formats = FORMATS if pte.missing() is None else tuple(f for f in FORMATS if f != "pte")
        config = ExportConfig(
            checkpoint=trained.checkpoint.path, out_dir=folder / "export", formats=formats
        )
        return export(config)

    return shared(tmp_path_factory, "exported", make)


@pytest.fixture(scope="session")
def precision_exported(
    trained: TrainResult, tmp_path_factory: pytest.TempPathFactory
) -> ExportResult:
    """The digits CNN in every reduced-precision format (int8 static and dynamic, float16),
    from the same checkpoint as `exported`, in a folder of its own: the float32 formats'
    tests compare with eager elementwise and must not meet these."""

    def make(folder: Path) -> ExportResult:
        config = ExportConfig(
            checkpoint=trained.checkpoint.path,
            out_dir=folder / "export",
            formats=PRECISION_FORMATS,
        )
        return export(config)

    return shared(tmp_path_factory, "precision_exported", make)


@pytest.fixture(scope="session")
def mobilenet(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    """torchvision's mobilenet_v3_small, --random-init (BatchNorm statistics calibrated,
    so its outputs have a realistic scale), as TorchScript and ONNX."""

    def make(root: Path) -> ExportResult:
        return export(
            ExportConfig(
                model="torchvision:mobilenet_v3_small",
                random_init=True,
                checkpoint=root / "checkpoint.pt",
                out_dir=root / "export",
                formats=("torchscript", "onnx"),
            )
        )

    return shared(tmp_path_factory, "mobilenet", make)


@pytest.fixture(scope="session")
def resnet18_cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`pipeline --artifacts-dir ART export --model torchvision:resnet18 --random-init` as a
    user runs it (the default formats: TorchScript and ONNX), once per session: {art,
    export_dir, returncode, stdout, stderr}. test_user_models checks the command and
    verifies what it wrote; test_cpp_client times its TorchScript file against C++."""

    def make(root: Path) -> dict[str, Any]:
        art = root / "art"
        proc = run_cli(
            "--artifacts-dir", art, "export", "--model", "torchvision:resnet18", "--random-init",
            cwd=root,
        )  # fmt: skip
        return {
            "art": str(art),
            "export_dir": str(art / "torchvision_resnet18" / "export"),
            "returncode": proc.returncode,
            "stdout": proc.stdout,
            "stderr": proc.stderr,
        }

    return shared(tmp_path_factory, "resnet18_cli", make)


# The built-in models with data-dependent control flow (the TorchScript tutorial's).
FAMILY = ["my_decision_gate", "my_cell", "my_rnn_loop", "wrap_rnn"]


@pytest.fixture(scope="session")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExportResult]:
    """The control-flow family, trained and exported (every served format) once per session."""

    def make(root: Path) -> dict[str, ExportResult]:
        results = {}
        for name in FAMILY:
            config = TrainConfig(
                model=name, out=root / name / "checkpoint.pt", progress=False, device="cpu"
            )
            ckpt = train(config)
            results[name] = export(
                ExportConfig(
                    model=name,
                    checkpoint=ckpt.checkpoint.path,
                    out_dir=root / name / "export",
                    formats=SERVED_FORMATS,
                )
            )
        return results

    return shared(tmp_path_factory, "family", make)


@pytest.fixture(scope="session")
def all_exports(exported: ExportResult, family: dict[str, ExportResult]) -> dict[str, ExportResult]:
    """Every built-in model's export: the digits CNN and the control-flow family."""
    return {"digits_lenet": exported, **family}


@pytest.fixture(scope="session")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C++ client, built for real once per session under pytest's temp dir, by
    `pipeline build-cpp` as on a machine without the CUDA toolkit: no nvcc on PATH and
    no system toolkit visible (PIPELINE_CUDA_ROOTS=""), so the wheels' nvcc builds it.
    Where the wheels' nvcc is not installed (a GPU machine's own torch) the system's does."""
    from pipeline.formats import cpp

    def build(folder: Path) -> Path:
        env = without_system_cuda() if cpp.wheel_nvcc_dir() else dict(os.environ)
        cmd = [sys.executable, "-m", "pipeline", "build-cpp", "--build-dir", str(folder)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        return cpp.binary_path(folder)

    return shared(tmp_path_factory, "cpp_build", build)


def pinned_torch() -> str:
    """The torch version pyproject.toml pins."""
    import tomllib

    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    return next(
        d.split("==")[1] for d in deps["project"]["dependencies"] if d.startswith("torch==")
    )


def written_or_skip(result: ExportResult, fmt: str) -> None:
    """Skip unless the export wrote `fmt`, where this machine's own torch is not the pinned
    one (a GPU machine's image: tests/run_gpu.sh): with the pinned torch a missing format
    fails the test that needs it, as it should."""
    if fmt in result.manifest.artifacts or torch.__version__.split("+")[0] == pinned_torch():
        return
    why = result.manifest.failed.get(fmt, "not asked for")
    pytest.skip(f"torch {torch.__version__} (not the pinned one) did not write {fmt}: {why}")


def without_system_cuda() -> dict[str, str]:
    """This process's environment with every nvcc folder off PATH and no system toolkit."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_HOME"}
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if d and not Path(d, "nvcc").exists()
    )
    env["PIPELINE_CUDA_ROOTS"] = ""
    return env


def run_cli(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m pipeline ARGS` as a user runs it (warnings off, output captured);
    `env`: variables added to this process's. The command's process is forked from one
    that has imported torch already (tests/cli_fork.py says why and what differs), or,
    when `env` adds to the environment, started as a plain subprocess."""
    base = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return cli_fork.run(
        [*map(str, args)], cwd=cwd, env={**base, **(env or {})}, base=base, timeout=600
    )


def assert_clean_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Non-zero exit, one readable message naming the problem, no traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "\nerror: " in "\n" + proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def exited(pid: int) -> bool:
    """Whether `pid` no longer runs: gone, or a zombie its parent has not reaped yet
    (`pipeline stop` returns once nothing of a server runs, not once PID 1 has reaped it)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_kill_lost_nothing(report: Any, requests: int) -> None:
    """The kill-a-worker standard every runtime meets (`loadtest --kill-worker-after`): a
    worker was killed, every request was answered and right, service came back within a
    minute, and the dead worker was replaced by a new one."""
    assert report.killed_pid is not None
    assert report.passed, report.summary()  # no request failed, none was wrong, none lost
    assert report.answered == requests
    assert report.recovery_s is not None and report.recovery_s < 60, report.summary()
    assert report.killed_pid not in report.worker_pids_after
    assert len(report.worker_pids_after) == len(report.worker_pids_before)
