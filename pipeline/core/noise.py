"""Libraries' messages about their own environment, kept off the terminal unless `-v`.

What reaches the terminal is ours: results, our warnings, and what a library says
about the user's model (a TracerWarning is reported as the reason a trace was
rejected). What a library says about itself, and that the user cannot act on, is
silenced at its source, and only there:

- a library logger's records: `quiet_libraries()`, called by the CLI, raises the
  level of each logger in `LIBRARY_LOGGERS` unless `-v` (each entry says why);
- Python warnings raised inside one library call we make: `library_warnings()`
  around that call records them and logs them at DEBUG, so `pipeline -v` shows
  them. The process's warning filters are never changed, so a warning raised by
  the user's code outside those calls is shown as Python shows it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterable, Iterator

log = logging.getLogger(__name__)

# Logger → why its records are noise. Raised to ERROR without -v; left alone with it.
LIBRARY_LOGGERS: dict[str, str] = {
    # Warns "No CUDA runtime is found, using CUDA_HOME='/usr/local'" when imported (by
    # AOTInductor, to load or compile a .pt2) on a machine with nvcc and no GPU: its
    # guess at a toolkit for building torch C++ extensions, which nothing here asks
    # for (build-cpp finds the toolkit itself, formats/cpp.py).
    "torch.utils.cpp_extension": "CUDA_HOME guess for C++ extensions on a GPU-less machine",
}


def quiet_libraries(verbose: bool, loggers: Iterable[str] = LIBRARY_LOGGERS) -> None:
    """Silence `loggers` below ERROR unless `verbose` (then they log as they would)."""
    for name in loggers:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)


def log_warnings(what: str, caught: Iterable[warnings.WarningMessage]) -> None:
    """Log warnings recorded while `what` ran, at DEBUG (`pipeline -v` shows them)."""
    for w in caught:
        log.debug(
            "%s warned at %s:%s: %s: %s", what, w.filename, w.lineno, w.category.__name__, w.message
        )


@contextlib.contextmanager
def library_warnings(what: str, *categories: type[Warning]) -> Iterator[None]:
    """Keep the warnings of `categories` (of every category when none is named) that the
    block raises off the terminal: they are logged at DEBUG instead. Others are passed on
    to the process's filters, as if they had not been caught."""
    kinds = categories or (Warning,)
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        log_warnings(what, [w for w in caught if issubclass(w.category, kinds)])
        for w in caught:
            if not issubclass(w.category, kinds):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
