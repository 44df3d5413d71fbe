"""`pipeline publish`, `rollout`, `rollback` and `status`: the versioned store and a running
server's versions (pipeline.serving.versions, pipeline.serving.rollout)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pipeline.cli.args import model_arg, run_dir_arg, running_store, serve_run_dir, store_arg

log = logging.getLogger("pipeline")


def add_version_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish",
        help="add an export to the versioned store as the model's next version",
        description="Copy an export (manifest, artifacts, golden I/O) into "
        "<store>/<model>/<N>/ with its provenance: the checkpoint behind it and a passing "
        "verify report (verify runs first when the report is missing, failed or older than "
        "the export). The first version becomes the default `pipeline serve` serves; later "
        "ones wait for `pipeline rollout`.",
    )
    model_arg(p, export_dir=True)
    p.add_argument("--export-dir", type=Path, help="default: <artifacts>/<model>/export")
    p.add_argument(
        "--report",
        type=Path,
        help="default: <artifacts>/<model>/parity.json, or X.parity.json beside an --export-dir X",
    )
    p.add_argument("--checkpoint", type=Path, help="default: the one the manifest names")
    p.add_argument(
        "--sign",
        type=Path,
        metavar="KEY",
        help="sign the version with this elliptic-curve private key (PEM; `pipeline keygen`); "
        "the signature, signature.sig, is kept in the version folder",
    )
    p.add_argument(
        "--key-password-env",
        metavar="VAR",
        help="the environment variable holding --sign's key password (an encrypted key)",
    )
    store_arg(p)
    p.set_defaults(func=_cmd_publish)

    p = sub.add_parser(
        "keygen",
        help="make an elliptic-curve key pair to sign versions with (publish --sign)",
        description="Write a new P-256 private key to --out (readable by its owner only) and "
        "its public key beside it as <name>.pub: sign with the first (`pipeline publish "
        "--sign`), trust the second (--trust, or a copy in <store>/trust/). openssl makes "
        "the same: `openssl ecparam -name prime256v1 -genkey -noout -out KEY && openssl ec "
        "-in KEY -pubout -out KEY.pub`.",
    )
    p.add_argument("--out", type=Path, required=True, help="the private key's path")
    p.set_defaults(func=_cmd_keygen)

    p = sub.add_parser(
        "rollout",
        help="serve another published version on a running server, checked live first",
        description="Load --version beside the version serving, on every worker, with no "
        "restart; check it through the live server against its own golden I/O and probes; "
        "only then move traffic (all of it, or --canary PCT of unversioned requests, watched "
        "for --watch seconds and rolled back by itself past --max-error-rate or "
        "--max-p99-ratio). A failed check refuses the rollout and the old version keeps "
        "serving (exit 1). --promote moves the rest of the traffic to the canary.",
    )
    model_arg(p)
    p.add_argument("--version", type=int, help="the published version to roll out")
    p.add_argument("--canary", type=float, metavar="PCT", help="send PCT%% of traffic to it")
    p.add_argument("--promote", action="store_true", help="make the canary the default")
    p.add_argument(
        "--watch", type=float, default=10.0, help="seconds a canary is watched (default: 10)"
    )
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=0.01,
        help="a canary answering more 5xx than this share is rolled back (default: 0.01)",
    )
    p.add_argument(
        "--max-p99-ratio",
        type=float,
        default=3.0,
        help="a canary whose p99 is over this many times the default's is rolled back (default: 3)",
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=20,
        help="canary answers before the bounds are judged; --promote refuses a canary with "
        "fewer (default: 20; 0 promotes it unjudged)",
    )
    p.add_argument(
        "--timeout", type=float, default=180.0, help="seconds for the workers to load a version"
    )
    store_arg(p, running=True)
    run_dir_arg(p)
    p.set_defaults(func=_cmd_rollout)

    p = sub.add_parser(
        "rollback",
        help="undo the last rollout: drop the canary, or return to the previous default",
        description="With a canary serving, take it out (the default keeps all traffic). "
        "Otherwise load the previous default beside the current one, move all traffic to "
        "it, unload the current one once its requests finish, and move the store's pointer "
        "back. With no server running only the pointer moves.",
    )
    model_arg(p)
    store_arg(p, running=True)
    run_dir_arg(p)
    p.set_defaults(func=_cmd_rollback)

    p = sub.add_parser(
        "status",
        help="the running server and the versions it serves; the store's versions",
        description="Print the server `pipeline serve` started from the run dir (runtime, "
        "URL, models), each served model's versions, default and canary share, and the "
        "versions the store holds for each, with each one's signature checked against the "
        "trust policy (<store>/trust/*.pub and --trust); with --json, the same as JSON. A "
        "server that exited without `pipeline stop` is named, with its log's last errors. "
        "Exit status 1 when it did, when one of its processes did (TorchServe's gateway) or when "
        "a served model is not ready; 0 otherwise (also "
        "when no server runs from the run dir).",
    )
    store_arg(p, running=True)
    p.add_argument("--json", action="store_true", help="print JSON")
    run_dir_arg(p)
    p.set_defaults(func=_cmd_status)


def _cmd_publish(args: argparse.Namespace) -> int:
    from pipeline.serving.publish import PublishConfig, publish_export

    published = publish_export(
        PublishConfig(
            model=args.model,
            export_dir=args.export_dir,
            report=args.report,
            checkpoint=args.checkpoint,
            store=args.store,
            artifacts_dir=args.artifacts_dir,
            sign=args.sign,
            key_password=_password(args.key_password_env),
        ),
        say=print,
    )
    from pipeline.core import signing

    v = published.version
    print(f"published {v.model} version {v.number}: {v.dir}")
    if published.signer:
        print(f"  signed by key {published.signer[:16]} ({v.dir / 'signature.sig'})")
    elif signing.Policy.load(args.store, []).declared:
        # Said now, not at the rollout that would refuse it.
        print(
            f"warning: {args.store} has a trust policy ({args.store / signing.TRUST_FOLDER}) and "
            "this version is not signed: serve, rollout and rollback will refuse it; publish "
            "it with --sign KEY",
            file=sys.stderr,
        )
    from pipeline.serving.server import store_flag

    if published.made_default:
        print("  the default (the first version): `pipeline serve` serves it")
    else:
        print(
            f"  roll it out with `pipeline rollout --model {v.model} --version {v.number}{store_flag(args.store)}`"
        )
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    from pipeline.serving.rollout import Bounds, RolloutConfig, rollout

    rollout(
        RolloutConfig(
            model=args.model,
            run_dir=serve_run_dir(args),
            version=args.version,
            store=running_store(args),
            canary=args.canary,
            promote=args.promote,
            watch_s=args.watch,
            bounds=Bounds(args.max_error_rate, args.max_p99_ratio, args.min_requests),
            timeout_s=args.timeout,
        ),
        say=print,
    )
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from pipeline.serving.rollout import rollback

    rollback(args.model, serve_run_dir(args), running_store(args), say=print)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from pipeline.serving.status import status, status_lines, troubled

    found = status(serve_run_dir(args), running_store(args))
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        for line in status_lines(found):
            print(line)
    return 1 if troubled(found) else 0


def _password(var: str | None) -> str | None:
    import os

    from pipeline.core.errors import PipelineError

    if var is None:
        return None
    if var not in os.environ:
        raise PipelineError(f"--key-password-env: ${var} is not set.")
    return os.environ[var]


def _cmd_keygen(args: argparse.Namespace) -> int:
    from pipeline.core.signing import fingerprint, keygen

    public = keygen(args.out)
    print(
        f"private key: {args.out} (keep it secret; sign with `pipeline publish --sign {args.out}`)"
    )
    print(f"public key:  {public} (fingerprint {fingerprint(public.read_bytes())[:16]})")
    print(f"  trust it with --trust {public}, or copy it into <store>/trust/")
    return 0


# The commands that take a version from the store (and so check its signature).
TRUSTING = ("serve", "rollout", "rollback", "archive", "status")


def add_trust_options(sub: argparse._SubParsersAction) -> None:
    """--trust on every command that takes a version from the store, deploy's targets too."""
    parsers = [sub.choices[n] for n in TRUSTING if n in sub.choices]
    deploy = sub.choices.get("deploy")
    if deploy is not None:
        for action in deploy._subparsers._group_actions if deploy._subparsers else ():
            parsers += list(getattr(action, "choices", {}).values())
    for p in parsers:
        p.add_argument(
            "--trust",
            type=Path,
            action="append",
            metavar="PUBKEY",
            help="a public key whose signed versions are trusted (repeatable; with <store>/"
            "trust/*.pub, the trust policy): a version from the store that is unsigned, "
            "signed by another key or changed since signed is refused",
        )


def use_trust(args: argparse.Namespace) -> None:
    """--trust's keys into $PIPELINE_TRUST, where the checks and the processes a command
    starts (a runtime's workers, torchrun) read them."""
    import os

    from pipeline.core.errors import PipelineError
    from pipeline.core.signing import TRUST_ENV

    keys = getattr(args, "trust", None)
    if not keys:
        return
    folders = [str(k) for k in keys if Path(k).is_dir()]
    if folders:
        raise PipelineError(
            f"--trust takes key files, not folders ({', '.join(folders)}): repeat it for each "
            "public key (--trust keys/a.pub --trust keys/b.pub)."
        )
    missing = [str(k) for k in keys if not Path(k).is_file()]
    if missing:
        raise PipelineError(f"--trust: no such key file: {', '.join(missing)}.")
    os.environ[TRUST_ENV] = os.pathsep.join(str(Path(k).resolve()) for k in keys)
