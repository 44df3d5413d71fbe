"""Libraries' messages about their environment stay off the terminal unless -v; ours pass.

pipeline/core/noise.py: the CLI raises the level of the loggers in LIBRARY_LOGGERS
unless -v, and `library_warnings` turns the warnings of one library call into DEBUG
records. Neither touches the process's warning filters.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import pytest

from pipeline.cli import main
from pipeline.core.noise import LIBRARY_LOGGERS, library_warnings, quiet_libraries

CUDA_HOME_LOGGER = "torch.utils.cpp_extension"  # "No CUDA runtime is found, using CUDA_HOME=..."


@pytest.fixture(autouse=True)
def _restore_levels() -> Iterator[None]:
    names = [*LIBRARY_LOGGERS, "pipeline"]
    saved = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def _levels() -> dict[str, int]:
    return {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}


def test_the_cuda_home_guess_is_a_silenced_logger() -> None:
    assert CUDA_HOME_LOGGER in LIBRARY_LOGGERS


@pytest.mark.parametrize("verbose", [False, True])
def test_the_cli_silences_library_loggers_only_without_v(verbose: bool) -> None:
    filters = list(warnings.filters)
    argv = ["-v"] * verbose + ["where", "--model", "digits_lenet"]
    assert main(argv) == 0
    want = logging.NOTSET if verbose else logging.ERROR
    assert _levels() == dict.fromkeys(LIBRARY_LOGGERS, want)
    # A library's warning about its environment is below the bar without -v ...
    assert logging.getLogger(CUDA_HOME_LOGGER).isEnabledFor(logging.WARNING) == verbose
    # ... ours is not, and the process's warning filters are as they were.
    assert logging.getLogger("pipeline.export").isEnabledFor(logging.WARNING)
    assert warnings.filters == filters


def test_quiet_libraries_toggles_back() -> None:
    quiet_libraries(False)
    assert set(_levels().values()) == {logging.ERROR}
    quiet_libraries(True)
    assert set(_levels().values()) == {logging.NOTSET}


def test_library_warnings_logs_the_named_categories_and_passes_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.DEBUG, logger="pipeline.core.noise"),
        warnings.catch_warnings(record=True) as shown,
    ):
        warnings.simplefilter("always")
        with library_warnings("torch.jit.save", FutureWarning):
            warnings.warn("`torch.jit.save` is deprecated", FutureWarning, stacklevel=1)
            warnings.warn("our own: outputs stay tiny", UserWarning, stacklevel=1)
        warnings.warn("the user's model warns", UserWarning, stacklevel=1)
    assert [str(w.message) for w in shown] == [
        "our own: outputs stay tiny",
        "the user's model warns",
    ]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(logged) == 1 and "torch.jit.save warned at" in logged[0]
    assert "FutureWarning: `torch.jit.save` is deprecated" in logged[0]


def _export_that_warns_then_fails() -> None:
    with library_warnings("torch.export"):
        warnings.warn("graph break", UserWarning, stacklevel=1)
        raise RuntimeError("export failed")


def test_library_warnings_without_categories_logs_every_warning_even_on_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.DEBUG, logger="pipeline.core.noise"),
        warnings.catch_warnings(record=True) as shown,
    ):
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError):
            _export_that_warns_then_fails()
    assert shown == []
    assert any("torch.export warned at" in r.getMessage() for r in caplog.records)
