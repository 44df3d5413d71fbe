"""Signed versions: who published each version of the store, and whether its bytes changed.

`pipeline publish --sign KEY` signs the version folder with OpenSSF's model-signing
library (an elliptic-curve key, offline: no Sigstore, no network). The signature bundle,
`signature.sig`, is kept in the version folder and left out of what it signs; it holds
the sha256 of every other file and the signer's key fingerprint (the sha256 of its PEM
public key, the library's own key hint).

A trust policy is the set of public keys whose signatures count: `--trust PUBKEY` (on
serve, rollout, rollback, archive and deploy; kept in $PIPELINE_TRUST for the processes a
command starts), else the store's own `<store>/trust/*.pub` (given keys replace the
folder, so the store's writers cannot widen them). With a policy, every command that
takes a version from the store checks it first (`require`) and refuses a version that is
unsigned, signed by a key the policy does not hold, changed since it was signed (naming
the file) or moved from where it was published. Without one, they warn once and go on,
so an existing store keeps working. A store's trust folder is a policy even once its
last key is removed: it then trusts nobody (revoking a key never turns the checks off).
`pipeline status` and verify's report show each version's state (`state`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Keys live apart; signing.keygen and signing.SignatureError stay where callers find them.
from pipeline.core.signkeys import SignatureError, check_private_key, keygen  # noqa: F401

log = logging.getLogger(__name__)

SIGNATURE = "signature.sig"  # in the version folder, beside what it signs
TRUST_FOLDER = "trust"  # <store>/trust/*.pub: the store's own trust policy
TRUST_ENV = "PIPELINE_TRUST"  # --trust's keys, os.pathsep-separated, for child processes
PUBLIC_SUFFIXES = (".pub", ".pem")
# A store version's provenance file (versions.PROVENANCE is this): what marks a folder as one.
PROVENANCE = "publish.json"

SIGNED, UNSIGNED, CHANGED, UNTRUSTED, UNCHECKED = (
    "signed",
    "unsigned",
    "changed since signed",
    "signed by an untrusted key",
    "signed, not checked",
)


@dataclass(frozen=True)
class State:
    """A version's signature as checked against a policy."""

    state: str  # one of SIGNED, UNSIGNED, CHANGED, UNTRUSTED, UNCHECKED
    signer: str | None  # the signing key's fingerprint (and its name in the policy)
    detail: str = ""

    @property
    def trusted(self) -> bool:
        return self.state == SIGNED

    def to_json(self) -> dict[str, str | None]:
        return {"state": self.state, "signer": self.signer, "detail": self.detail}

    def describe(self) -> str:
        return describe(self.to_json())


def describe(found: dict[str, str | None]) -> str:
    """One line for a State's JSON: "signed by alice (562f1df701ed320b)", "unsigned", …"""
    by = f" by {found['signer']}" if found.get("signer") else ""
    if found["state"] == UNCHECKED:
        return f"signed{by} (not checked: no trust policy)"
    if found["state"] == UNTRUSTED:
        return f"signed{by}, a key {found['detail']}"
    return f"{found['state']}{by}" + (f": {found['detail']}" if found.get("detail") else "")


def fingerprint(public_pem: bytes) -> str:
    """A public key's fingerprint as model-signing writes it into a bundle (its key hint)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(public_pem)
    canonical = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(canonical).hexdigest()


def _hashing() -> Any:  # model_signing's hashing.Config
    # Imported here, not at the top: model-signing imports sigstore, slow to import.
    from model_signing import hashing

    # Git's paths too: model-signing skips .git/ and .gitignore by default, so files put
    # there after signing were never looked at.
    return hashing.Config().set_ignored_paths(paths=[SIGNATURE], ignore_git_paths=False)


def sign(folder: Path, private_key: Path, password: str | None = None) -> str:
    """Sign every file in `folder` (but the signature) into `folder/signature.sig`; returns
    the signer's fingerprint."""
    from model_signing import signing

    folder, private_key = Path(folder), Path(private_key)
    if not private_key.is_file():
        raise SignatureError(f"--sign: there is no private key at {private_key}.")
    check_private_key(private_key, password)
    try:
        # As bytes: model-signing's hint says str, but it hands the password to
        # cryptography's PEM loader, which takes bytes only (a str failed every time).
        config = signing.Config().use_elliptic_key_signer(
            private_key=private_key,
            password=password.encode() if password is not None else None,  # type: ignore[arg-type]
        )
        config.set_hashing_config(_hashing()).sign(folder, folder / SIGNATURE)
    except (ValueError, TypeError) as err:
        raise SignatureError(
            f"--sign: {private_key} is not an elliptic-curve private key model-signing takes "
            f"(P-256, P-384 or P-521, PEM; `pipeline keygen` makes one): {err}"
        ) from None
    return signer_of(folder) or "?"


def signer_of(folder: Path) -> str | None:
    """The fingerprint a version's signature names (None: unsigned or unreadable)."""
    try:
        bundle = json.loads((Path(folder) / SIGNATURE).read_text())
        return str(bundle["verificationMaterial"]["publicKey"]["hint"]) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Policy:
    """The trusted public keys: fingerprint → (name, path). `declared`: whether there is a
    policy at all (--trust given, or the store has a trust folder), so a trust folder
    emptied by revoking its last key trusts nobody rather than turning the checks off."""

    keys: dict[str, tuple[str, Path]]
    sources: tuple[str, ...]  # where the keys came from, for messages
    declared: bool = True

    @classmethod
    def load(cls, store: Path | None, given: Sequence[str] | None = None) -> Policy:
        """--trust's keys (`given`; default: $PIPELINE_TRUST), else `store`'s trust folder.
        Given keys replace the folder rather than add to it: keys kept where the store's
        writers cannot reach protect against them only if a key they add to trust/ does
        not count (it did)."""
        paths: list[Path] = []
        sources: list[str] = []
        given = given_keys() if given is None else [p for p in given if p]
        if given:
            paths += map(Path, given)
            sources.append("--trust")
        folder = Path(store) / TRUST_FOLDER if store is not None else None
        declared = bool(given)
        if not given and folder is not None and folder.is_dir():
            declared = True
            found = sorted(p for p in folder.iterdir() if p.suffix.lower() in PUBLIC_SUFFIXES)
            paths += found
            sources.append(str(folder) if found else f"{folder}, which holds no key")
        keys: dict[str, tuple[str, Path]] = {}
        for path in paths:
            try:
                keys[fingerprint(path.read_bytes())] = (path.stem, path)
            except (OSError, ValueError, TypeError) as err:
                private = path.is_file() and b"PRIVATE KEY" in path.read_bytes()
                raise SignatureError(
                    f"The trusted key {path} is a PRIVATE key: remove it now (whoever reads "
                    "it can sign versions) and trust its public key (<name>.pub) instead."
                    if private
                    else f"The trusted key {path} is not a PEM public key ({err})."
                ) from None
        return cls(keys, tuple(sources), declared)

    def within(self, pinned: Sequence[str]) -> Policy:
        """This policy, trusting at most the fingerprints `pinned` (a running server's, from
        its start): a key added to trust/ since does not count, one removed is revoked, and
        a trust folder deleted since trusts nobody rather than turning the checks off."""
        keys = {fp: key for fp, key in self.keys.items() if fp in pinned}
        held = f"{len(keys)} of the {len(pinned)} key(s) `serve` started with; restart it to trust one added since"
        return Policy(keys, (*(self.sources or ("no trust folder now",)), held))

    def name(self, fp: str | None) -> str | None:
        if fp is None:
            return None
        return f"{self.keys[fp][0]} ({fp[:16]})" if fp in self.keys else fp[:16]


def given_keys() -> list[str]:
    """The public keys --trust gave this command or the one that started this process."""
    return [p for p in os.environ.get(TRUST_ENV, "").split(os.pathsep) if p]


def is_version(folder: Path) -> bool:
    """Whether `folder` is a published version of a store (not an export folder): it holds
    publish.json, or is named as one (`<store>/<model>/<number>/`). By its name too, so that
    deleting publish.json does not turn the checks off: such a version fails them."""
    folder = Path(folder)
    return (folder / PROVENANCE).is_file() or version_number(folder.name) is not None


def version_number(name: str) -> int | None:
    """The version a store folder's name says ("3"), None for any other name ("03", "x")."""
    return int(name) if re.fullmatch(r"[1-9][0-9]*", name) else None


def store_of(version_dir: Path) -> Path:
    """The store a version folder is in: `<store>/<model>/<number>/`. Not through symlinks:
    a model folder linked into another store must not bring that store's trust folder."""
    return Path(os.path.abspath(version_dir)).parent.parent


def state(version_dir: Path, policy: Policy | None = None) -> State:
    """`version_dir`'s signature checked against `policy` (default: its store's and --trust)."""
    from model_signing import verifying

    version_dir = Path(version_dir)
    policy = policy if policy is not None else Policy.load(store_of(version_dir))
    fp = signer_of(version_dir)
    if fp is None:
        if (version_dir / SIGNATURE).exists():  # there, but not a bundle: say so
            return State(UNSIGNED, None, f"{SIGNATURE} is there but is not a signature bundle")
        return State(UNSIGNED, None)
    if not policy.declared:
        return State(UNCHECKED, fp[:16])
    if fp not in policy.keys:
        return State(UNTRUSTED, fp[:16], f"not in the trust policy ({', '.join(policy.sources)})")
    config = verifying.Config().use_elliptic_key_verifier(public_key=policy.keys[fp][1])
    try:
        config.set_hashing_config(_hashing()).verify(version_dir, version_dir / SIGNATURE)
    except ValueError as err:  # the library names the files: "Hash mismatch for 'model.onnx'…"
        return State(CHANGED, policy.name(fp), _changed(str(err)))
    except Exception as err:  # noqa: BLE001 - a bundle that does not verify is not trusted
        # The key hint is the bundle's own claim: a forged one names a trusted key. No
        # signer then, only what the bundle claims, so nobody reads "changed by alice".
        why = _first_line(str(err)) or type(err).__name__  # a forged key hint says nothing
        return State(
            CHANGED,
            None,
            f"the signature names the key {policy.name(fp)} but does not verify with it: {why}",
        )
    moved = _moved(version_dir)
    return State(CHANGED, policy.name(fp), moved) if moved else State(SIGNED, policy.name(fp))


def _moved(version_dir: Path) -> str:
    """Why a signed version is not where it was published ("" when it is): its signed
    publish.json names the model and number, so a signed version copied to another number
    (an old one replayed as the newest) or another model's folder is refused."""
    from pipeline.core.paths import model_slug

    try:
        said = json.loads((version_dir / PROVENANCE).read_text())
        model, number = str(said["model"]), int(said["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"{PROVENANCE} is missing or unreadable"
    here = Path(os.path.abspath(version_dir))
    if (model_slug(model), number) != (here.parent.name, version_number(here.name)):
        return (
            f"it was published as {model} version {number} but lies in "
            f"{here.parent.name}/{here.name}: a signed version copied to another place"
        )
    return ""


def _changed(message: str) -> str:
    """model-signing's mismatch message (a list's repr, with digests) as the files it names."""
    text = message.replace("\\'", "'")
    changed = re.findall(r"Hash mismatch for '([^']+)'", text)
    extra = re.findall(r"Extra files found in model '[^']*': ([^\"\]]+)", text)
    missing = re.findall(r"Missing files in model '[^']*': ([^\"\]]+)", text)
    parts = [f"{name} differs from the signed bytes" for name in changed]
    parts += [f"files not signed: {', '.join(x.strip(chr(39)) for x in extra)}"] if extra else []
    parts += (
        [f"signed files missing: {', '.join(x.strip(chr(39)) for x in missing)}"] if missing else []
    )
    return "; ".join(parts) or f"the signature does not verify: {_first_line(message)}"


def _first_line(message: str) -> str:
    """A library's message as one line for status (a malformed bundle's is pydantic's
    multi-line report)."""
    return (message.strip().splitlines() or [""])[0][:200]


_warned: set[str] = set()


def require(
    version_dir: Path,
    also: Sequence[str] = (),
    pinned: dict[str, list[str]] | None = None,
    store: Path | None = None,
) -> State | None:
    """Check a version the store hands to serve, rollout, rollback, archive or deploy: raise
    SignatureError when the trust policy refuses it; without a policy, warn once per store
    and go on. A folder that is not a published version (an export folder) is not checked:
    None. `also`: keys trusted beyond this command's --trust (a running server's);
    `pinned`: a running server's `pins`, the most its workers trust; `store`: the command's
    --store, whose policy makes an export folder worth a warning too."""
    version_dir = Path(version_dir)
    if not is_version(version_dir):
        # A policy (--trust, or the store's trust/), and nothing to check: said once.
        policed = given_keys() or (store is not None and Policy.load(Path(store), []).declared)
        if policed and str(version_dir) not in _warned:
            _warned.add(str(version_dir))
            print(
                f"warning: {version_dir} is an export folder, not a published version: the "
                "trust policy checks versions from a store only, so nothing was checked here "
                "(publish it with `pipeline publish --sign KEY` and use it from the store)",
                file=sys.stderr,
            )
        return None
    store = store_of(version_dir)
    policy = _pinned(Policy.load(store, [*given_keys(), *also]), store, pinned)
    if not policy.declared:
        if str(store) not in _warned:
            _warned.add(str(store))
            print(
                f"warning: {store} has no trust policy, so its versions are used without "
                f"checking who published them (sign with `pipeline publish --sign KEY`, trust "
                f"with --trust PUBKEY or {store / TRUST_FOLDER}/*.pub; docs/versions.md, Signed versions)",
                file=sys.stderr,
            )
        return None
    return _refuse_untrusted(version_dir, policy)


def unheld(
    keys: Sequence[str], held: Sequence[str], store: Path, pinned: dict[str, list[str]] | None
) -> list[str]:
    """Those of `keys` (paths) whose fingerprint is neither among `held`'s nor in `store`'s
    trust folder (within a running server's `pinned`): what a command's --trust adds
    beyond a running server's policy."""
    have = _pinned(Policy.load(store, list(held)), store, pinned).keys
    return [k for k in keys if fingerprint(Path(k).read_bytes()) not in have]


def pins(version_dirs: Sequence[Path], trust: Sequence[str]) -> dict[str, list[str]]:
    """The keys each store's trust policy holds as `serve` starts ({store: fingerprints},
    for the stores of `version_dirs` that have a policy), which its workers' `recheck`
    trusts at most: deleting the trust folder, or adding a key to it, changed what a
    running server's restarted worker accepted."""
    found: dict[str, list[str]] = {}
    for version_dir in map(Path, version_dirs):
        if is_version(version_dir):
            store = store_of(version_dir)
            policy = Policy.load(store, trust)
            if policy.declared:
                found[str(store)] = sorted(policy.keys)
    return found


def recheck(
    version_dir: Path, trust: Sequence[str], pinned: dict[str, list[str]] | None = None
) -> State | None:
    """The check again, as a runtime's worker loads a version: a KServe worker restarted
    or a Ray replica placed again (on another node, perhaps) reads the store long after
    `serve` checked it, and whoever can write to the store may have changed it since.
    `trust`: the keys `serve` was given (a replica on another node has not its
    environment), beside the store's own trust folder; `pinned`: `pins` as `serve`
    started. Raises SignatureError as `require` does; without a policy it says nothing
    (`serve` warned) and returns None."""
    version_dir = Path(version_dir)
    if not is_version(version_dir):
        return None
    store = store_of(version_dir)
    policy = _pinned(Policy.load(store, trust), store, pinned)
    return _refuse_untrusted(version_dir, policy) if policy.declared else None


def _pinned(policy: Policy, store: Path, pinned: dict[str, list[str]] | None) -> Policy:
    """`policy`, within the keys `pinned` holds for `store` (if it holds any)."""
    if pinned and str(store) in pinned:
        return policy.within(pinned[str(store)])
    return policy


def _refuse_untrusted(version_dir: Path, policy: Policy) -> State:
    found = state(version_dir, policy)
    if found.trusted:
        log.info("%s: %s", version_dir, found.describe())
        return found
    why = {
        UNSIGNED: "is not signed"
        + (f" ({found.detail})" if found.detail else "")
        + ", and the trust policy accepts only signed versions (publish it again with --sign KEY)",
        CHANGED: f"changed since it was signed ({found.detail})",
        UNTRUSTED: f"is signed by key {found.signer}, {found.detail}",
    }[found.state]
    raise SignatureError(f"Refused: the version in {version_dir} {why}.")
