"""A user's `nn.Module` class from `--model package.module:ClassName` or
`--model path/to/file.py:ClassName`, with one paragraph saying what to do when it cannot
be imported."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from torch import nn

from pipeline.core.errors import UnknownModelError
from pipeline.core.paths import model_slug


def _sibling_hint(err: Exception, path: Path) -> str | None:
    """What to do when a model file imports a module that sits beside it: `file.py:Class`
    imports that one file, without its folder on the path (unlike `python file.py`)."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    top, folder = err.name.split(".")[0], path.parent
    beside = next((p for p in (folder / f"{top}.py", folder / top) if p.exists()), None)
    if beside is None:
        return None
    return (
        f"{beside} is beside it, but a model file is imported on its own, without its folder "
        f"on the path: run every stage that builds the model (export, verify) with that folder "
        f"on PYTHONPATH (PYTHONPATH={folder}), or name the class as module:Class from an "
        "installed package."
    )


def import_class(name: str) -> type[nn.Module]:
    where, _, cls_name = name.rpartition(":")
    if not where or not cls_name:
        raise UnknownModelError(
            f"Bad model {name!r}: expected package.module:ClassName or file.py:ClassName."
        )
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise UnknownModelError(f"Model file {path} (from --model {name!r}) does not exist.")
        module_name = f"pipeline_user_{model_slug(name)}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:  # pragma: no cover - only for odd file types
            raise UnknownModelError(f"Cannot import {path} as Python.")
        module = importlib.util.module_from_spec(spec)
        # Registered so that torch.jit.script can find the class's source.
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - any error in the user's file
            del sys.modules[module_name]
            where = f" (line {err.lineno})" if isinstance(err, SyntaxError) and err.lineno else ""
            raise UnknownModelError(
                f"Importing {path}{where} failed: {type(err).__name__}: {err}. "
                + (_sibling_hint(err, path) or "Fix the file and retry.")
            ) from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise UnknownModelError(
                f"Cannot import module {where!r} for --model {name!r}: {err}. Make it importable "
                "(install it or add its folder to PYTHONPATH) or pass path/to/file.py:ClassName."
            ) from None
        except Exception as err:  # noqa: BLE001 - any error while importing the user's module
            raise UnknownModelError(
                f"Importing {where!r} failed: {type(err).__name__}: {err}."
            ) from None
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UnknownModelError(f"{where} has no torch.nn.Module subclass named {cls_name!r}.")
    return cls
