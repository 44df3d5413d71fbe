"""Libraries of custom operators an artifact needs before it can be loaded.

A TorchScript file that calls torchvision's operators (`torchvision::nms`, which
a scripted detector calls) cannot even be loaded until the library registering
them is: `torch.jit.load` fails with `Unknown builtin op: torchvision::nms`.
Export records the libraries in the artifact's manifest record
(`"op_libraries": ["torchvision"]`); this module loads them in Python and names
the shared libraries the C++ client must `--load-library`, in order.

torchvision's wheel ships its operators in `torchvision/_C_stable.so`, which
lists `libtorch_python.so` as a needed library (it uses none of its symbols),
and `libtorch_python.so` needs libpython's symbols. A C++ process with no
Python in it therefore dlopens three files, in this order: libpython,
`torch/lib/libtorch_python.so`, `torchvision/_C_stable.so`.

Importable without torchvision: it is imported only when a record asks for it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

# The manifest key, in an artifact record's details.
OP_LIBRARIES_KEY = "op_libraries"

# Operator namespace → the Python package whose import registers it. The
# package's compiled op library is `<package>/<name>` for the first name found.
KNOWN: dict[str, tuple[str, ...]] = {
    "torchvision": ("_C_stable.so", "_C.so"),
}


class OpLibraryError(RuntimeError):
    """A library of custom operators an artifact needs cannot be found or loaded
    (the TorchScript loader raises it as a `runners.LoadError`)."""


def op_libraries_of(module: torch.jit.ScriptModule) -> list[str]:
    """The known op libraries MODULE's forward calls (submodules and functions inlined)."""
    graph = str(module.inlined_graph)  # `.graph` alone keeps submodule calls opaque
    return [name for name in KNOWN if re.search(rf"\b{re.escape(name)}::", graph)]


def _check_known(names: Iterable[str]) -> list[str]:
    names = list(names)
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise OpLibraryError(
            f"unknown op librar{'y' if len(unknown) == 1 else 'ies'} {unknown} in the manifest; "
            f"known: {', '.join(KNOWN)}. Upgrade the pipeline that reads this export."
        )
    return names


def load_op_libraries(names: Iterable[str]) -> None:
    """Register the operators of NAMES in this process (before `torch.jit.load`)."""
    for name in _check_known(names):
        try:
            importlib.import_module(name)  # torchvision loads _C_stable.so on import
        except ImportError as err:
            raise OpLibraryError(
                f"this model calls {name}'s custom operators ({name}::...), and {name} is not "
                f"installed here ({err}); install the {name} that matches torch "
                f"{torch.__version__} (pip install {name})."
            ) from None


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # without importing it
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise OpLibraryError(
            f"this model calls {name}'s custom operators ({name}::...), and {name} is not "
            f"installed here; install the {name} that matches torch {torch.__version__} "
            f"(pip install {name})."
        )
    return Path(locations[0])


def libpython() -> Path:
    """The shared libpython of this interpreter (libpython3.X.so.1.0)."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    names = [sysconfig.get_config_var(k) for k in ("INSTSONAME", "LDLIBRARY")]
    candidates = [Path(libdir, n) for n in names if n and ".so" in n]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        looked = ", ".join(map(str, candidates)) or f"LIBDIR={libdir!r}"
        raise OpLibraryError(
            f"no shared libpython found (looked at {looked}; Py_ENABLE_SHARED="
            f"{sysconfig.get_config_var('Py_ENABLE_SHARED')}). The C++ client needs it for "
            "libtorch_python.so, which the op library links against: use a Python built "
            "with --enable-shared."
        )
    return found


def cpp_library_paths(names: Sequence[str]) -> list[Path]:
    """The shared libraries the C++ client must `--load-library`, in order, for NAMES:
    libpython, torch/lib/libtorch_python.so, then each package's op library."""
    names = _check_known(names)
    if not names:
        return []
    torch_python = Path(torch.__file__).parent / "lib" / "libtorch_python.so"
    if not torch_python.is_file():
        raise OpLibraryError(
            f"{torch_python} is missing; the op libraries {names} link against it. Reinstall torch."
        )
    paths = [libpython(), torch_python]
    for name in names:
        package = _package_dir(name)
        library = next((package / f for f in KNOWN[name] if (package / f).is_file()), None)
        if library is None:
            raise OpLibraryError(
                f"{name} at {package} has no compiled op library (looked for "
                f"{', '.join(KNOWN[name])}); reinstall {name}."
            )
        paths.append(library)
    return paths
