"""Signed versions (pipeline/core/signing.py) on a small version folder, with OpenSSF's
model-signing library for real: signed and trusted, one byte changed, another key, unsigned
with and without a policy; `pipeline serve`, `archive` and `deploy` refusing before they
start anything, and `status` showing each version's state. Serving a signed version and a
rollout refusing one are in tests/integration/test_rollout.py. The policy's edges found by
trying it as a user would (2026-11-28; each failed on the code before): a trust folder
emptied by revoking its last key, an encrypted signing key, a signature file that is not
one, a rollback with no server running, a rollout's --trust beside a running server's."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.core import signing
from pipeline.serving import versions
from pipeline.serving.rollout import RolloutRefusedError, rollback
from pipeline.serving.server import Server
from pipeline.serving.status import status, status_lines

MODEL = "digits_lenet"


# Every test here: no $PIPELINE_TRUST left over (conftest.no_trust_env); `keys` is there.
pytestmark = pytest.mark.usefixtures("no_trust_env")


def _version(store: Path, number: int = 1) -> Path:
    """A published version's folder as the store holds one (its files' contents do not
    matter to the signature), and the pointer naming it the default."""
    folder = store / MODEL / str(number)
    folder.mkdir(parents=True)
    (folder / "publish.json").write_text(json.dumps({"model": MODEL, "version": number}))
    (folder / "manifest.json").write_text("{}")
    (folder / "model.onnx").write_bytes(bytes(range(256)) * 4)
    versions.write_pointer(MODEL, versions.Pointer(number, []), store)
    return folder


def _trust(store: Path, public: Path) -> None:
    (store / "trust").mkdir(exist_ok=True)
    (store / "trust" / public.name).write_bytes(public.read_bytes())


def test_keygen_writes_an_owner_only_private_key_and_refuses_to_replace_one(
    keys: dict[str, Path],
) -> None:
    alice = keys["alice"]
    assert alice.stat().st_mode & 0o777 == 0o600
    assert alice.with_suffix(".pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    with pytest.raises(signing.SignatureError, match="exists"):
        signing.keygen(alice)


def test_a_signed_version_is_trusted_and_names_its_signer(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    folder = _version(tmp_path)
    fp = signing.sign(folder, keys["alice"])
    assert (folder / signing.SIGNATURE).is_file()
    assert fp == signing.fingerprint(keys["alice"].with_suffix(".pub").read_bytes())
    _trust(tmp_path, keys["alice"].with_suffix(".pub"))
    found = signing.require(folder)
    assert found is not None and found.trusted
    assert found.signer == f"alice ({fp[:16]})"


def test_one_byte_changed_is_refused_naming_the_file(keys: dict[str, Path], tmp_path: Path) -> None:
    folder = _version(tmp_path)
    signing.sign(folder, keys["alice"])
    _trust(tmp_path, keys["alice"].with_suffix(".pub"))
    data = bytearray((folder / "model.onnx").read_bytes())
    data[100] ^= 1
    (folder / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(
        signing.SignatureError, match=r"changed since it was signed \(model\.onnx differs"
    ):
        signing.require(folder)
    assert signing.state(folder).state == signing.CHANGED


def test_a_file_added_after_signing_is_refused(keys: dict[str, Path], tmp_path: Path) -> None:
    folder = _version(tmp_path)
    signing.sign(folder, keys["alice"])
    _trust(tmp_path, keys["alice"].with_suffix(".pub"))
    (folder / "extra.py").write_text("print('hello')")
    with pytest.raises(signing.SignatureError, match=r"extra\.py"):
        signing.require(folder)


def test_another_key_is_refused(keys: dict[str, Path], tmp_path: Path) -> None:
    folder = _version(tmp_path)
    signing.sign(folder, keys["mallory"])
    _trust(tmp_path, keys["alice"].with_suffix(".pub"))
    with pytest.raises(signing.SignatureError, match="not in the trust policy"):
        signing.require(folder)


def test_trust_from_the_environment_counts_as_a_policy(
    keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _version(tmp_path)
    signing.sign(folder, keys["mallory"])
    monkeypatch.setenv(signing.TRUST_ENV, str(keys["alice"].with_suffix(".pub")))
    with pytest.raises(signing.SignatureError, match=r"\(--trust\)"):
        signing.require(folder)
    monkeypatch.setenv(signing.TRUST_ENV, str(keys["mallory"].with_suffix(".pub")))
    assert signing.require(folder).trusted


def test_unsigned_is_refused_under_a_policy(keys: dict[str, Path], tmp_path: Path) -> None:
    folder = _version(tmp_path)
    _trust(tmp_path, keys["alice"].with_suffix(".pub"))
    with pytest.raises(signing.SignatureError, match="is not signed"):
        signing.require(folder)


def test_without_a_policy_a_version_is_used_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _version(tmp_path)
    assert signing.require(folder) is None
    assert signing.require(folder) is None
    err = capsys.readouterr().err
    assert err.count("has no trust policy") == 1, err
    # An export folder (no publish.json) is not a version: nothing to check, nothing said.
    assert signing.require(tmp_path) is None and capsys.readouterr().err == ""


def test_a_workers_recheck_uses_the_keys_serve_was_given_and_is_silent_without_a_policy(
    keys: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a runtime's worker runs as it loads a version (signing.recheck): the keys come
    from its config, not its environment (a Ray replica on another node has not serve's)."""
    folder = _version(tmp_path)
    signing.sign(folder, keys["alice"])
    alice = str(keys["alice"].with_suffix(".pub"))
    assert signing.recheck(folder, [alice]).trusted
    with pytest.raises(signing.SignatureError, match="not in the trust policy"):
        signing.recheck(folder, [str(keys["mallory"].with_suffix(".pub"))])
    (folder / "model.onnx").write_bytes(b"changed")
    with pytest.raises(signing.SignatureError, match=r"model\.onnx differs from the signed"):
        signing.recheck(folder, [alice])
    # No policy: serve warned already, the worker loads without a word; an export folder
    # (no publish.json) is never a store version.
    assert signing.recheck(folder, []) is None and signing.recheck(tmp_path, [alice]) is None
    assert capsys.readouterr().err == ""
    _trust(tmp_path, keys["alice"].with_suffix(".pub"))  # the store's own policy counts too
    with pytest.raises(signing.SignatureError, match="changed since it was signed"):
        signing.recheck(folder, [])


def test_serve_archive_and_deploy_refuse_a_changed_version_before_starting_anything(
    keys: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    folder = _version(store)
    signing.sign(folder, keys["alice"])
    (folder / "model.onnx").write_bytes(b"changed")
    trust = str(keys["alice"].with_suffix(".pub"))
    commands = [
        ["serve", "--runtime", "kserve", "--model", MODEL, "--store", str(store),
         "--run-dir", str(tmp_path / "run"), "--trust", trust],
        ["archive", "--model", MODEL, "--store", str(store), "--trust", trust],
        ["deploy", "kserve", "--model", MODEL, "--export-dir", str(folder),
         "--out", str(tmp_path / "deploy"), "--trust", trust],
        ["deploy", "ray", "--model", MODEL, "--export-dir", str(folder),
         "--out", str(tmp_path / "deploy-ray"), "--trust", trust],
    ]  # fmt: skip
    for argv in commands:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert (
            "changed since it was signed" in err
            and "model.onnx differs from the signed bytes" in err
        ), err
    assert not (tmp_path / "run" / "server.json").exists()
    assert not (tmp_path / "deploy").exists() and not (tmp_path / "deploy-ray").exists()
    assert os.environ.get(signing.TRUST_ENV)  # what the processes a command starts read


def test_status_shows_each_versions_signature(keys: dict[str, Path], tmp_path: Path) -> None:
    store = tmp_path / "store"
    one = _version(store, 1)
    signing.sign(one, keys["alice"])
    _version(store, 2)
    _trust(store, keys["alice"].with_suffix(".pub"))
    found = status(tmp_path / "run", store)
    signed = found["store"][MODEL]["signatures"]
    assert signed["1"]["state"] == signing.SIGNED and signed["2"]["state"] == signing.UNSIGNED
    lines = status_lines(found)
    assert any(line.strip().startswith("version 1: signed by alice (") for line in lines), lines
    assert "  version 2: unsigned" in lines, lines


def test_status_takes_trust_from_the_command_line(
    keys: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key given with --trust, as serve takes it, not only the store's trust folder."""
    store = tmp_path / "store"
    signing.sign(_version(store, 1), keys["alice"])
    argv = ["status", "--store", str(store), "--run-dir", str(tmp_path / "run")]
    assert main(argv) == 0
    assert "version 1: signed by" in (out := capsys.readouterr().out) and "not checked" in out
    assert main([*argv, "--trust", str(keys["alice"].with_suffix(".pub"))]) == 0
    out = capsys.readouterr().out
    assert "  version 1: signed by alice (" in out and "not checked" not in out, out


def test_a_trust_folder_whose_last_key_was_removed_trusts_nobody(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    """SECURITY.md: remove a key's .pub from trust/ and the versions it signed are refused.
    Removing the only one used to turn the policy off (every version served unchecked)."""
    folder = _version(tmp_path)
    signing.sign(folder, keys["alice"])
    _trust(tmp_path, keys["alice"].with_suffix(".pub"))
    assert signing.require(folder).trusted  # type: ignore[union-attr]
    for key in (tmp_path / "trust").iterdir():
        key.unlink()
    with pytest.raises(signing.SignatureError, match="holds no key"):
        signing.require(folder)
    with pytest.raises(signing.SignatureError, match="not in the trust policy"):
        signing.recheck(folder, [])  # a worker loading it: the same answer
    assert signing.state(folder).state == signing.UNTRUSTED
    (tmp_path / "trust").rmdir()  # no folder at all: no policy, as before
    assert signing.state(folder).state == signing.UNCHECKED


def test_an_encrypted_key_signs_with_its_password_and_says_why_it_does_not(
    keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.cli.versions import _password  # what --key-password-env VAR reads

    encrypted = tmp_path / "enc.key"
    subprocess.run(
        ["openssl", "pkcs8", "-topk8", "-in", str(keys["alice"]), "-v2", "aes-256-cbc",
         "-passout", "pass:s3cret", "-out", str(encrypted)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("KEY_PASSWORD", "s3cret")
    folder = _version(tmp_path / "store")
    fp = signing.sign(folder, encrypted, _password("KEY_PASSWORD"))
    assert fp == signing.fingerprint(keys["alice"].with_suffix(".pub").read_bytes())
    with pytest.raises(signing.SignatureError, match="wrong password"):
        signing.sign(folder, encrypted, "wrong")
    with pytest.raises(signing.SignatureError, match="is encrypted; give its password"):
        signing.sign(folder, encrypted, None)


def test_a_signature_file_that_is_not_a_bundle_is_named(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    folder = _version(tmp_path)
    (folder / signing.SIGNATURE).write_text("{not json")
    found = signing.state(folder)
    assert found.state == signing.UNSIGNED and "not a signature bundle" in found.detail
    _trust(tmp_path, keys["alice"].with_suffix(".pub"))
    with pytest.raises(signing.SignatureError, match=r"is not signed \(signature.sig is there"):
        signing.require(folder)


def test_a_rollback_with_no_server_refuses_a_version_the_policy_refuses(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    """Without a server only the store's pointer moves, but the next `serve` would then
    refuse the model: the check comes first, and the pointer stays."""
    store = tmp_path / "store"
    for n in (1, 2):
        signing.sign(_version(store, n), keys["alice"])
    versions.write_pointer(MODEL, versions.Pointer(2, [1]), store)
    _trust(store, keys["alice"].with_suffix(".pub"))
    (store / MODEL / "1" / "model.onnx").write_bytes(b"changed")
    with pytest.raises(signing.SignatureError, match=r"model\.onnx differs from the signed bytes"):
        rollback(MODEL, tmp_path / "run", store, say=lambda _: None)
    assert versions.read_pointer(MODEL, store).default == 2
    argv = ["rollback", "--model", MODEL, "--store", str(store), "--run-dir", str(tmp_path / "r")]
    assert main(argv) == 1
    assert versions.read_pointer(MODEL, store).default == 2


def _server(trust: list[str]) -> Server:
    server = Server(
        runtime="kserve", pid=0, run_dir="/nonexistent", inference_url="", metrics_url="",
        models=[MODEL],
    )  # fmt: skip
    return replace(server, trust=trust)


def test_a_rollout_checks_with_the_running_servers_keys_and_refuses_keys_it_lacks(
    keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's workers check what they load against `serve --trust`'s keys and the
    store's folder: a rollout's own check uses those keys (no 'no trust policy' warning
    when the server has one), and a key only the rollout was given is refused up front
    rather than passing here and failing in the workers."""
    from pipeline.serving.rollout import _trusted

    store = tmp_path / "store"
    alice, mallory = (keys[k].with_suffix(".pub") for k in ("alice", "mallory"))
    good = _version(store, 1)
    signing.sign(good, keys["alice"])
    other = _version(store, 2)
    signing.sign(other, keys["mallory"])
    # The server trusts alice; this command was given nothing: alice's version passes.
    assert _trusted(good, _server([str(alice)])) is None
    with pytest.raises(signing.SignatureError, match="not in the trust policy"):
        _trusted(other, _server([str(alice)]))
    # This command's --trust names mallory, whom the server does not trust.
    monkeypatch.setenv(signing.TRUST_ENV, str(mallory))
    with pytest.raises(RolloutRefusedError, match="not this command's"):
        _trusted(other, _server([str(alice)]))
    # A key added to the store's trust folder does not reach a server given its keys with
    # --trust (they replace the folder: the store's writers cannot widen them); it does
    # reach one whose policy is the folder.
    _trust(store, mallory)
    with pytest.raises(RolloutRefusedError, match="restart `pipeline serve` with it"):
        _trusted(other, _server([str(alice)]))
    assert _trusted(other, _server([])) is None  # a server that recorded no pins
    # A server started under the folder's policy trusts at most the keys it held then.
    pinned = replace(_server([]), pins={str(store): [signing.fingerprint(alice.read_bytes())]})
    with pytest.raises(RolloutRefusedError, match="trust/ held as `pipeline serve` started"):
        _trusted(other, pinned)  # mallory given with --trust too (the environment's)
    monkeypatch.delenv(signing.TRUST_ENV)
    with pytest.raises(signing.SignatureError, match=r"0 of the 1 key\(s\) `serve` started with"):
        _trusted(other, pinned)  # mallory in trust/, added since; alice never there


def test_trust_given_for_an_export_folder_says_nothing_was_checked(
    keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`deploy kserve --trust KEY` of an export folder (not a store version) went ahead
    with no word that the key checked nothing (a user's trial, 2026-11-28)."""
    folder = tmp_path / "export"
    folder.mkdir()
    assert signing.require(folder) is None and capsys.readouterr().err == ""  # no --trust
    monkeypatch.setenv(signing.TRUST_ENV, str(keys["alice"].with_suffix(".pub")))
    assert signing.require(folder) is None and signing.require(folder) is None
    err = capsys.readouterr().err
    assert err.count("is an export folder, not a published version") == 1, err


def test_a_stores_own_policy_also_says_an_unpublished_export_was_not_checked(
    keys: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """`serve --store S --model M` with M unpublished in S, whose trust/ is a policy, served
    the export folder without a word (with --trust, the same said it; a user's trial)."""
    from pipeline.serving.runtime import ServeOptions

    store = tmp_path / "store"
    options = ServeOptions(run_dir=tmp_path, artifacts_dir=tmp_path / "art", store=store)
    assert options.export_dir_of(MODEL) == tmp_path / "art" / MODEL / "export"
    assert capsys.readouterr().err == ""  # no policy: nothing to say
    store.mkdir()
    _trust(store, keys["alice"].with_suffix(".pub"))
    assert options.export_dir_of(MODEL) == tmp_path / "art" / MODEL / "export"
    err = capsys.readouterr().err
    assert "is an export folder, not a published version: the trust policy" in err, err
