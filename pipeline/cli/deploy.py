"""The `pipeline` subcommands that deploy an export: serve, stop, infer, loadtest, and the
commands runtimes contribute (TorchServe's `archive`, `deploy kserve`).

Like the rest of the CLI, this only parses arguments and calls a stage function.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any

from pipeline.cli.args import run_dir_arg, serve_run_dir, terminated_as_exit
from pipeline.cli.use import add_client_commands


def add_serving_commands(sub: argparse._SubParsersAction) -> None:
    from pipeline.formats import base as registry
    from pipeline.serving import runtime

    formats = list(registry.keys())
    # Commands a runtime contributes (TorchServe's `archive`), where `archive` always was.
    for rt in runtime.all_runtimes():
        if rt.commands:
            rt.commands.add(sub, formats)

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
        help="stop the server `pipeline serve` started, whichever runtime it is",
        description="Stop whichever runtime `pipeline serve` started from the run dir (its "
        "record names it; processes left without a record are found by their command line) "
        "and say which it was.",
    )
    run_dir_arg(p)
    p.set_defaults(func=_cmd_stop)

    add_client_commands(sub, formats)


def add_serve_options(p: argparse.ArgumentParser, formats: list[str]) -> None:
    """The options every runtime takes, then one help group per runtime with its own."""
    from pipeline.core import argtypes
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
    p.add_argument(
        "--port", type=argtypes.port, default=8080, help="inference port (default: 8080)"
    )
    p.add_argument("--tls-cert", type=Path, help="serve HTTPS with this PEM certificate chain")
    p.add_argument("--tls-key", type=Path, help="the PEM private key of --tls-cert")
    p.add_argument(
        "--threads-per-worker",
        type=argtypes.positive_int,
        help="intra-op threads per worker (default: torchserve: physical cores / all "
        "workers, at least 1; kserve: physical cores / its --workers, at least 1)",
    )
    p.add_argument(
        "--max-request-size",
        type=argtypes.positive_int,
        default=4 * 1024 * 1024,
        help="bytes (default: 4 MiB)",
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
            # The runtime's own option of the same meaning, by its name's ending (--format
            # → --ray-format): the refusal said only whose option it was.
            own = [
                o
                for g in given
                for a in mine
                for o in a.option_strings[:1]
                if o != g and o.endswith("-" + g.lstrip("-"))
            ]
            instead = f"; with --runtime {args.runtime} use {', '.join(own)}" if own else ""
            raise PipelineError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --runtime {name}, "
                f"not {args.runtime}{instead}; see `pipeline serve --help`."
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
    with terminated_as_exit():  # a SIGTERM (CI's timeout) mid-start stops what it started
        server = rt.serve(options)
    # Its store, for rollout, rollback and status run without --store (every runtime).
    extras = {**server.extras, "store": str(Path(options.store).resolve())}
    # A hint that restarts it repeats its options.
    command = args.argv if getattr(args, "argv", None) else server.command
    server = dataclasses.replace(server, extras=extras, command=command)
    server.record()
    for line in rt.describe(server):
        print(line)
    from pipeline.serving.served import choice_lines

    # Which format each model is served in and why: bench's fastest within the accuracy
    # budget (int8/float16 only when they keep to it), else the registry's first.
    for line in choice_lines(server, args.artifacts_dir):
        print(line)
    from pipeline.serving.fits import oversize_lines

    for line in oversize_lines(server, options.max_request_size, options.manifest_of):
        print(line, file=sys.stderr)
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
    from pipeline.serving.server import SERVER_FILE, ServeError, Server

    run_dir = serve_run_dir(args)
    kind = found_runtime(run_dir)  # before stopping: the record goes with the server
    recorded = (run_dir / SERVER_FILE).is_file()
    left: list[int] = []  # what an exited server left running (its gateway, say)
    with contextlib.suppress(OSError, ValueError, TypeError, ServeError):  # a damaged record
        left = Server.load(run_dir).alive_pids() if recorded else []
    if stop(run_dir):
        print(f"stopped {kind or 'the server'} (run dir {run_dir})")
    elif recorded:  # a server that exited on its own: its log says why
        why = f"{kind or 'the server'} recorded there had exited on its own"
        ended = f"; stopped what it left running (pid {', '.join(map(str, left))})" if left else ""
        print(f"no server was running from {run_dir}: {why}{ended} (logs: {run_dir / 'logs'})")
    else:
        print(f"no server was running from {run_dir} (no record there, no process started from it)")
    return 0
