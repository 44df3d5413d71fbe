"""`pipeline archive`: TorchServe's command, contributed to the CLI through the runtime's
`commands` capability (pipeline.serving.capabilities.Commands), as `deploy kserve` is
through the KServe runtime's `deploy`. This module stays light: it only parses arguments
and calls the archive stage (archive.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.core import paths
from pipeline.core.cliargs import add_budget_args, model_arg
from pipeline.core.paths import DEFAULT_STORE


def add_archive_command(sub: argparse._SubParsersAction, formats: list[str]) -> None:
    """Add `pipeline archive`; `formats`: the registry's keys, its --format choices."""
    p = sub.add_parser(
        "archive",
        help="package an export as TorchServe .mar files in model_store/",
        description="Write one model_store/<model>_<format>.mar per format the export holds "
        "(artifact, handler and its runtime, manifest, golden inputs for warm-up, "
        "model-config.yaml, and archive.json naming the model, the format and the fastest "
        "backend `pipeline bench` measured). A model published to --store (`pipeline "
        "publish`) is archived at its default version, with that number as the archive's "
        "version.",
    )
    model_arg(p, export_dir=True)
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="default: model_store")
    p.add_argument(
        "--format",
        action="append",
        choices=formats,
        help="default: every format the export holds",
    )
    p.add_argument(
        "--bench-results",
        type=Path,
        help="the fastest.json `pipeline bench` wrote (default: <artifacts>/bench/fastest.json "
        "when it exists); `pipeline serve` then serves each model's fastest format only",
    )
    p.add_argument("--batch-size", type=int, default=8, help="TorchServe batch size (default: 8)")
    p.add_argument(
        "--max-batch-delay-ms",
        type=int,
        default=1,
        help="how long TorchServe waits for a batch to fill; a lone request waits all of it "
        "(default: 1, its smallest; 0 means TorchServe's own 100 ms, and is taken only with "
        "--batch-size 1)",
    )
    p.add_argument("--min-workers", type=int, default=1, help="default: 1")
    p.add_argument("--max-workers", type=int, default=1, help="default: 1")
    p.add_argument("--response-timeout", type=int, default=30, help="seconds (default: 30)")
    p.add_argument("--startup-timeout", type=int, default=120, help="seconds (default: 120)")
    p.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        help="pin workers to cpu or gpu (default: a GPU when the server has one, else CPU)",
    )
    add_budget_args(p)
    p.set_defaults(func=_cmd_archive)


def _cmd_archive(args: argparse.Namespace) -> int:
    from pipeline.core import signing
    from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
    from pipeline.serving import versions
    from pipeline.serving.provenance import default_bench_results

    export_dir = args.export_dir or paths.export_dir(args.model, args.artifacts_dir)
    version = "1.0"  # model-archiver's default, for an export never published
    published = None if args.export_dir else versions.default(args.model, args.store)
    if published is not None:  # a published model: its default version, numbered as such
        signing.require(published.dir)  # the trust policy, when there is one
        export_dir, version = published.dir, str(published.number)
        print(f"archiving {args.model} version {version} (the store's default)")
    config = ArchiveConfig(
        model=args.model,
        export_dir=export_dir,
        version=version,
        store=args.store,
        formats=tuple(args.format) if args.format else None,
        bench_results=args.bench_results or default_bench_results(args.artifacts_dir),
        batch_size=args.batch_size,
        max_batch_delay_ms=args.max_batch_delay_ms,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        response_timeout_s=args.response_timeout,
        startup_timeout_s=args.startup_timeout,
        device=args.device,
        accuracy_budget=args.accuracy_budget,
        min_sqnr=args.min_sqnr,
    )
    for path in archive(config):
        print(f"wrote {path}")
    from pipeline.core.manifest import read_manifest
    from pipeline.serving.provenance import fastest_entry
    from pipeline.serving.served import choose

    if config.formats is None:  # every format archived: say which one serve will pick
        manifest = read_manifest(config.export_dir)  # type: ignore[arg-type]
        fastest = fastest_entry(config.model, config.bench_results)
        fmt, why = choose(manifest, fastest, config.accuracy_budget, config.min_sqnr)
        print(f"`pipeline serve` will serve {config.model} as {fmt}: {why}")
    return 0
