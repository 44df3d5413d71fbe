"""Argument helpers that commands in several layers share: the CLI's own, and the ones a
runtime contributes (`pipeline archive`, from TorchServe's package). Torch-free."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """The CLI's parser: a --model left out is filled in once parsed (resolve_model), for
    whoever parses (main, and tests that build the parser)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        resolve_model(parsed)
        return parsed, rest


def model_arg(
    p: argparse.ArgumentParser, *, built_in_only: bool = False, export_dir: bool = False
) -> None:
    """--model. `export_dir`: the command also takes --export-dir, and --model defaults to
    the model that folder holds (resolve_model)."""
    from pipeline.core.defaults import DEFAULT_MODEL  # not pipeline.zoo: it imports torch

    if built_in_only:  # `train` has a task (data, loss) for the built-in models only
        help = (
            f"a built-in model (default: {DEFAULT_MODEL}; see `pipeline models`). Your own "
            "model trains in your code; bring its state_dict with `export --weights` "
            "(docs/own-model.md)"
        )
    else:
        help = (
            f"a built-in model (default: {DEFAULT_MODEL}; see `pipeline models`), "
            "package.module:ClassName, path/to/file.py:ClassName or torchvision:NAME"
        )
    if built_in_only:
        p.add_argument(
            "--model",
            action="append",
            dest="models",
            metavar="MODEL",
            help=f"{help}. Repeat it to train several in one launch (one torchrun start)",
        )
        p.set_defaults(models=None)
        return
    if not export_dir:
        p.add_argument("--model", default=DEFAULT_MODEL, help=help)
        return
    p.add_argument("--model", help=f"{help}. With --export-dir, default: the model it holds")
    model_from_export(p)


def model_from_export(p: argparse.ArgumentParser) -> None:
    """Mark `p`'s --model (no default of its own) as resolve_model's to fill in."""
    p.set_defaults(model=None, model_from_export=True)


def resolve_model(args: argparse.Namespace) -> None:
    """A --model left out (None): the model --export-dir holds, else the default model.
    Without this, `verify --export-dir DIR` of any other model was refused as not being
    the default model's export."""
    from pipeline.core.defaults import DEFAULT_MODEL

    if not getattr(args, "model_from_export", False) or args.model is not None:
        return
    export_dir = getattr(args, "export_dir", None)
    args.model = (exported_model(export_dir) if isinstance(export_dir, Path) else None) or (
        DEFAULT_MODEL
    )


def exported_model(export_dir: Path) -> str | None:
    """The model an export folder holds, None when it holds no readable manifest (the
    command then says what is wrong with the folder)."""
    from pipeline_runtime.manifest import Manifest

    try:
        return Manifest.read(export_dir).model.name
    except Exception:  # noqa: BLE001 - unreadable here, explained by the command
        return None


def add_budget_args(p: argparse.ArgumentParser, *, export: bool = False) -> None:
    """The reduced-precision formats' options: calibration data (export only) and the
    budget they are judged against (recorded by export, overridable after it)."""
    from pipeline.core.budget import DEFAULT_ACCURACY_BUDGET, DEFAULT_MIN_SQNR_DB

    g = p.add_argument_group("reduced precision (int8, float16 formats)")
    if export:
        g.add_argument(
            "--calibration",
            type=Path,
            metavar="FILE",
            help="representative inputs for static int8: a torch.save'd list of {name: tensor} "
            "dicts (one batch each) or an .npz with one array per input (default: the zoo "
            "model's training split, else random inputs from the input spec, with a warning)",
        )
    where = "recorded in the manifest" if export else "default: the one export recorded"
    sqnr = ", ".join(f"{k} {v:g}" for k, v in DEFAULT_MIN_SQNR_DB.items())
    g.add_argument(
        "--accuracy-budget",
        type=float,
        metavar="POINTS",
        default=DEFAULT_ACCURACY_BUDGET if export else None,
        help="the largest accuracy drop on the validation split (or top-1 disagreement with "
        f"float32 eager, for classifiers without data) in points ({where}; "
        f"{'default ' + str(DEFAULT_ACCURACY_BUDGET) if export else 'e.g. 1.0'})",
    )
    g.add_argument(
        "--min-sqnr",
        type=float,
        metavar="DB",
        help=f"the lowest SQNR per output for models that are not classifiers ({where}; "
        f"default by precision: {sqnr})",
    )
