"""The `pipeline` subcommands that deploy an export: archive, serve, stop, infer, loadtest.

Like the rest of the CLI, this only parses arguments and calls a stage function.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pipeline.cli.args import add_budget_args, model_arg, run_dir_arg, serve_run_dir
from pipeline.cli.use import add_client_commands
from pipeline.core import paths


def add_serving_commands(sub: argparse._SubParsersAction) -> None:
    from pipeline.core.paths import DEFAULT_STORE
    from pipeline.formats import base as registry

    formats = list(registry.keys())
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
    model_arg(p)
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
        "(default: 1, its smallest; 0 means TorchServe's 100 ms)",
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

    p = sub.add_parser(
        "serve",
        help="start a server (TorchServe by default) on 127.0.0.1 with secure defaults",
        description="Start a runtime on 127.0.0.1 with token authorization on; return once "
        "every model answers (or fail with the server's log). Clients get the inference key "
        "alone in <run dir>/inference_key.json. Each runtime's own options are in its group "
        "below and are refused with any other runtime.",
    )
    add_serve_options(p, formats)
    run_dir_arg(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser(
        "stop",
        help="stop the server `pipeline serve` started (TorchServe or the KServe runtime)",
        description="Stop whichever runtime `pipeline serve` started from the run dir (its "
        "record names it; processes left without a record are found by their command line) "
        "and say which it was.",
    )
    run_dir_arg(p)
    p.set_defaults(func=_cmd_stop)

    add_client_commands(sub, formats)


def _cmd_archive(args: argparse.Namespace) -> int:
    from pipeline.runtimes.torchserve.archive import ArchiveConfig, archive
    from pipeline.serving import versions
    from pipeline.serving.provenance import default_bench_results

    export_dir = args.export_dir or paths.export_dir(args.model, args.artifacts_dir)
    version = "1.0"  # model-archiver's default, for an export never published
    published = None if args.export_dir else versions.default(args.model, args.store)
    if published is not None:  # a published model: its default version, numbered as such
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


def add_serve_options(p: argparse.ArgumentParser, formats: list[str]) -> None:
    """The options every runtime takes, then one help group per runtime with its own."""
    from pipeline.core.paths import DEFAULT_STORE
    from pipeline.serving import runtime

    p.add_argument(
        "--runtime",
        choices=runtime.names(),
        default=runtime.default(),
        help=f"which server (default: {runtime.default()}): "
        + "; ".join(f"{d.name}: {d.title}" for d in runtime.declared()),
    )
    p.add_argument(
        "--model",
        action="append",
        dest="serve_models",
        metavar="MODEL",
        help="serve this model (as exported: digits_lenet, torchvision:resnet18; repeatable)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the server listens on (default: 127.0.0.1; TorchServe itself always "
        "stays on loopback behind its gateway). Any other address prints a warning: use "
        "HTTPS then.",
    )
    p.add_argument("--port", type=int, default=8080, help="inference port (default: 8080)")
    p.add_argument("--tls-cert", type=Path, help="serve HTTPS with this PEM certificate chain")
    p.add_argument("--tls-key", type=Path, help="the PEM private key of --tls-cert")
    p.add_argument(
        "--threads-per-worker",
        type=int,
        help="intra-op threads per worker (default: torchserve: physical cores / all "
        "workers, at least 1; kserve: physical cores)",
    )
    p.add_argument(
        "--max-request-size", type=int, default=4 * 1024 * 1024, help="bytes (default: 4 MiB)"
    )
    p.add_argument(
        "--store",
        type=Path,
        default=DEFAULT_STORE,
        help="the model store (default: model_store): a model published there (`pipeline "
        "publish`) is served at its default version; TorchServe's .mar archives live there too",
    )
    own: dict[str, list[argparse.Action]] = {}
    for rt in runtime.all_runtimes():
        group = _RuntimeGroup(p, f"--runtime {rt.name}", rt.description or rt.title)
        p._action_groups.append(group)  # as argparse's add_argument_group does
        before = len(group._group_actions)
        rt.add_serve_options(group, formats)
        own[rt.name] = group._group_actions[before:]
    p.set_defaults(runtime_options=own)


class _RuntimeGroup(argparse._ArgumentGroup):
    """One runtime's `pipeline serve` options. An option that several runtimes take
    (--shadow) is declared by each, alike: argparse takes an option string once, so a
    later declaration joins the first one's action to this group (listed under each
    runtime in --help, and each runtime's own). Declared otherwise, it is a bug."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        taken = next(
            (self._option_string_actions[a] for a in args if a in self._option_string_actions), None
        )
        if taken is None:
            return super().add_argument(*args, **kwargs)
        same = (
            list(args) == taken.option_strings
            and kwargs.get("type") is taken.type
            and kwargs.get("default") == taken.default
        )
        if not same:
            raise ValueError(
                f"{args[0]} is declared differently by two runtimes' serve options: "
                "declare it alike in both, or name it differently"
            )
        self._group_actions.append(taken)
        return taken


def refuse_other_runtimes(args: argparse.Namespace) -> None:
    """Options of a runtime other than --runtime's are an error (argparse groups only
    document; the groups' own actions say which option is whose). An option the runtime
    shares with another (_RuntimeGroup) is its own."""
    from pipeline.core.errors import PipelineError

    mine = set(args.runtime_options.get(args.runtime, []))
    for name, actions in args.runtime_options.items():
        if name == args.runtime:
            continue
        given = [
            a.option_strings[0]
            for a in actions
            if a not in mine and getattr(args, a.dest) != a.default
        ]
        if given:
            raise PipelineError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --runtime {name}, "
                f"not {args.runtime}; see `pipeline serve --help`."
            )


def _cmd_serve(args: argparse.Namespace) -> int:
    from pipeline.serving import runtime

    refuse_other_runtimes(args)
    rt = runtime.get(args.runtime)
    own = [a.dest for a in args.runtime_options.get(rt.name, [])]
    options = runtime.ServeOptions.from_args(args, serve_run_dir(args), own)
    refused = [o for o in options.given() if o in rt.refuses]
    if refused:
        raise runtime.RuntimeNameError(
            "; ".join(
                f"{rt.title} does not take --{o.replace('_', '-')}: {rt.refuses[o]}"
                for o in refused
            )
        )
    server = rt.serve(options)
    for line in rt.describe(server):
        print(line)
    from pipeline.serving.served import choice_lines

    # Which format each model is served in and why: bench's fastest within the accuracy
    # budget (int8/float16 only when they keep to it), else the registry's first.
    for line in choice_lines(server, args.artifacts_dir):
        print(line)
    return 0


def add_deploy_command(sub: argparse._SubParsersAction) -> None:
    """`pipeline deploy <target>`: each runtime adds its own targets."""
    from pipeline.serving import runtime

    deploy = sub.add_parser(
        "deploy",
        help="write Kubernetes manifests (and a container build file) for an export",
        description="Write what a cluster needs to serve an export; each runtime that can be "
        "deployed adds its target.",
    )
    targets = deploy.add_subparsers(dest="target", metavar="TARGET", required=True)
    for rt in runtime.all_runtimes():
        if rt.deploy:
            rt.deploy.add_command(targets)


def _cmd_stop(args: argparse.Namespace) -> int:
    from pipeline.serving.launcher import found_runtime, stop

    run_dir = serve_run_dir(args)
    kind = found_runtime(run_dir)  # before stopping: the record goes with the server
    if stop(run_dir):
        print(f"stopped {kind or 'the server'} (run dir {run_dir})")
    else:
        print(f"no server was running from {run_dir} (no record there, no process started from it)")
    return 0
