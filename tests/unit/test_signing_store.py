"""The trust policy against whoever can write to the store (a user's trial as an attacker
with write access, 2026-11-29; each test failed on the code before): publish.json deleted
to turn a worker's check off, a signed version copied to another number, a key added to
trust/ beside a server's --trust, a model folder linked into another store, "02" beside
"2", an archive whose archive.json names an unpublished model; and keys `keygen` lost or
`--sign` crashed on."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from pipeline.core import signing
from pipeline.runtimes.torchserve import store as ts_store
from pipeline.serving import versions
from pipeline.serving.server import ServeError
from tests.unit.test_signing import MODEL, _trust, _version

# As test_signing's: no $PIPELINE_TRUST left over; the keys alice and mallory (conftest).
pytestmark = pytest.mark.usefixtures("no_trust_env")


def _pub(key: Path) -> str:
    return str(key.with_suffix(".pub"))


def test_a_version_without_publish_json_is_still_checked_and_refused(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    # A worker's recheck decided "is a version" from publish.json, which the store's
    # writers can delete: the tampered version then loaded unchecked.
    folder = _version(tmp_path / "store")
    signing.sign(folder, keys["alice"])
    (folder / "model.onnx").write_bytes(b"tampered")
    (folder / "publish.json").unlink()
    assert signing.is_version(folder)
    with pytest.raises(signing.SignatureError, match=r"publish\.json"):
        signing.recheck(folder, [_pub(keys["alice"])])


def test_a_signed_version_copied_to_another_number_is_refused(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first = _version(store, 1)
    signing.sign(first, keys["alice"])
    policy = signing.Policy.load(store, [_pub(keys["alice"])])
    assert signing.state(first, policy).trusted
    replayed = store / MODEL / "7"
    shutil.copytree(first, replayed)
    found = signing.state(replayed, policy)
    assert found.state == signing.CHANGED and "copied to another place" in found.detail, found
    assert f"published as {MODEL} version 1" in found.detail
    other_model = store / "digits_mlp" / "1"
    shutil.copytree(first, other_model)
    assert signing.state(other_model, policy).state == signing.CHANGED


def test_trust_given_replaces_the_stores_trust_folder(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    # A key the store's writers add to trust/ widened a policy given with --trust.
    store = tmp_path / "store"
    folder = _version(store)
    signing.sign(folder, keys["mallory"])
    _trust(store, keys["mallory"].with_suffix(".pub"))
    assert signing.state(folder, signing.Policy.load(store, [])).trusted  # the folder's own
    pinned = signing.Policy.load(store, [_pub(keys["alice"])])
    assert pinned.sources == ("--trust",)
    assert signing.state(folder, pinned).state == signing.UNTRUSTED
    with pytest.raises(signing.SignatureError, match="signed by key"):
        signing.recheck(folder, [_pub(keys["alice"])])


def test_a_model_folder_linked_into_another_store_brings_no_trust_of_its_own(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    evil = tmp_path / "evil"
    signing.sign(_version(evil), keys["mallory"])
    _trust(evil, keys["mallory"].with_suffix(".pub"))
    store = tmp_path / "store"
    (store / "trust").mkdir(parents=True)  # a policy that trusts nobody yet
    (store / MODEL).symlink_to(evil / MODEL)
    linked = store / MODEL / "1"
    assert signing.store_of(linked) == store
    with pytest.raises(signing.SignatureError, match="not in the trust policy"):
        signing.require(linked)


def test_trust_keys_are_read_whatever_the_suffixs_case(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    (store / "trust").mkdir(parents=True)
    shutil.copy(keys["alice"].with_suffix(".pub"), store / "trust" / "alice.PUB")
    assert len(signing.Policy.load(store).keys) == 1


def test_only_canonical_version_names_are_versions(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _version(store, 2)
    shutil.copytree(store / MODEL / "2", store / MODEL / "02")
    shutil.copytree(store / MODEL / "2", store / MODEL / "²")  # isdigit(), not int()
    assert [v.number for v in versions.versions(MODEL, store)] == [2]
    assert [signing.version_number(n) for n in ("2", "02", "0", "x", "²")] == [2, None, None,
                                                                             None, None]  # fmt: skip


@pytest.mark.parametrize("out", ["k1.pub", ".", "folder"])
def test_keygen_refuses_an_out_that_would_lose_the_private_key(tmp_path: Path, out: str) -> None:
    # --out k1.pub wrote the private key and then the public key over it; "." crashed.
    (tmp_path / "folder").mkdir()
    with pytest.raises(signing.SignatureError, match="--out"):
        signing.keygen(tmp_path / out if out != "." else Path("."))
    assert not (tmp_path / "k1.pub").exists()


def test_signing_with_an_rsa_key_is_refused_by_its_cause(tmp_path: Path) -> None:
    # model-signing failed with AttributeError ('RSAPrivateKey' has no 'curve'): a traceback.
    key = tmp_path / "rsa.key"
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key.write_bytes(
        rsa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    folder = _version(tmp_path / "store")
    with pytest.raises(signing.SignatureError, match="not an elliptic-curve key"):
        signing.sign(folder, key)
    assert not (folder / signing.SIGNATURE).exists()


def _mar(path: Path, info: dict[str, str] | None) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("handler.py", "print('runs in TorchServe')\n")
        if info is not None:
            zf.writestr("archive.json", json.dumps(info))


def test_under_a_policy_torchserve_refuses_archives_no_signed_version_vouches_for(
    tmp_path: Path,
) -> None:
    # An archive whose archive.json names a model the store does not publish (renamed by
    # whoever can write to the store) was served unchecked, its handler code run.
    store = tmp_path / "store"
    store.mkdir()
    _mar(store / "renamed.mar", {"model": "digits_lenet_x", "format": "onnx"})
    _mar(store / "foreign.mar", None)
    assert ts_store.untied(store, ["renamed", "foreign"]) == []  # no policy: as before
    (store / "trust").mkdir()
    found = ts_store.untied(store, ["renamed", "foreign"])
    assert found == [
        f"renamed.mar (its archive.json names digits_lenet_x, which {store} does not publish)",
        "foreign.mar (it has no archive.json)",
    ]
    with pytest.raises(ServeError, match=r"Refused under the trust policy: renamed\.mar"):
        ts_store.refuse_untied(store, ["renamed"])


def test_under_a_policy_a_published_models_archive_under_another_name_is_refused(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    # A copy of a published model's archive with its handler changed, saved as a.mar: the
    # check archived the signed version again as <model>_onnx.mar beside it, and TorchServe
    # ran a.mar's handler (a user's trial, 2026-11-29).
    store = tmp_path / "store"
    signing.sign(_version(store), keys["alice"])
    _trust(store, keys["alice"].with_suffix(".pub"))
    canonical = f"{MODEL}_onnx"
    for name in ("a", canonical):
        _mar(store / f"{name}.mar", {"model": MODEL, "format": "onnx"})
    found = ts_store.untied(store, ["a", canonical])
    assert found == [
        f"a.mar (its archive.json names {MODEL} in onnx, archived as {canonical}.mar; no "
        "check reads an archive under another name)"
    ]
    assert ts_store.follow_defaults(store, ["a"]) == []  # not archived again beside it
    assert sorted(p.name for p in store.glob("*.mar")) == sorted(["a.mar", f"{canonical}.mar"])


def test_a_malformed_bundle_is_refused_in_one_line(keys: dict[str, Path], tmp_path: Path) -> None:
    # status printed pydantic's multi-line report inside the version's line.
    store = tmp_path / "store"
    folder = _version(store)
    signing.sign(folder, keys["alice"])
    bundle = json.loads((folder / signing.SIGNATURE).read_text())
    del bundle["dsseEnvelope"]
    (folder / signing.SIGNATURE).write_text(json.dumps(bundle))
    found = signing.state(folder, signing.Policy.load(store, [_pub(keys["alice"])]))
    assert found.state == signing.CHANGED and "\n" not in found.detail, found
    assert "does not verify" in found.detail, found


def test_a_forged_key_hint_is_not_shown_as_the_signer(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    # Mallory signs and writes alice's fingerprint into the bundle's key hint: refused,
    # but status said "changed by alice (...)", naming as signer a key that never signed.
    store = tmp_path / "store"
    folder = _version(store)
    signing.sign(folder, keys["mallory"])
    alice = signing.fingerprint(keys["alice"].with_suffix(".pub").read_bytes())
    bundle = json.loads((folder / signing.SIGNATURE).read_text())
    bundle["verificationMaterial"]["publicKey"]["hint"] = alice
    (folder / signing.SIGNATURE).write_text(json.dumps(bundle))
    found = signing.state(folder, signing.Policy.load(store, [_pub(keys["alice"])]))
    assert found.state == signing.CHANGED and found.signer is None, found
    assert found.detail.startswith(f"the signature names the key alice ({alice[:16]}) but"), found
    assert not found.describe().startswith("changed by"), found.describe()


def test_a_private_key_in_the_trust_folder_is_called_out(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    (store / "trust").mkdir(parents=True)
    shutil.copy(keys["alice"], store / "trust" / "alice.pem")
    with pytest.raises(signing.SignatureError, match="is a PRIVATE key: remove it now"):
        signing.Policy.load(store)


def test_trust_given_a_folder_says_to_name_each_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "no such key file: keys" of a folder that exists and holds keys.
    from pipeline.cli import main

    (tmp_path / "keys").mkdir()
    assert main(["status", "--trust", str(tmp_path / "keys"), "--run-dir", str(tmp_path)]) == 1
    said = capsys.readouterr().err
    assert "takes key files, not folders" in said and "no such key file" not in said, said


def test_a_running_server_trusts_at_most_the_keys_its_store_held_as_it_started(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    """A KServe worker restarted (or a Ray replica placed again) rechecks its version
    against the store's trust folder as it is then: deleting trust/ turned the check off
    (a tampered version served, the log silent), and a key added to it counted."""
    store = tmp_path / "store"
    folder = _version(store)
    signing.sign(folder, keys["alice"])
    _trust(store, keys["alice"].with_suffix(".pub"))
    pinned = signing.pins([folder, tmp_path], [])  # tmp_path: an export folder, no store
    alice = signing.fingerprint(keys["alice"].with_suffix(".pub").read_bytes())
    assert pinned == {str(store): [alice]}
    assert signing.recheck(folder, [], pinned).trusted

    shutil.rmtree(store / "trust")  # the policy deleted, the version then changed
    (folder / "model.onnx").write_bytes(b"changed")
    assert signing.recheck(folder, []) is None  # unpinned: what a worker did before
    with pytest.raises(signing.SignatureError, match="no trust folder now, 0 of the 1 key"):
        signing.recheck(folder, [], pinned)

    signing.sign(folder, keys["mallory"])  # re-signed by a key added to trust/ since
    _trust(store, keys["mallory"].with_suffix(".pub"))
    assert signing.recheck(folder, []).trusted
    with pytest.raises(signing.SignatureError, match="0 of the 1 key"):
        signing.recheck(folder, [], pinned)


def test_files_in_git_paths_are_signed_and_checked_like_any_other(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    # model-signing skips .git/ and .gitignore unless told not to: added after signing,
    # they were never noticed.
    store = tmp_path / "store"
    folder = _version(store)
    (folder / ".gitattributes").write_text("* binary\n")
    signing.sign(folder, keys["alice"])
    _trust(store, keys["alice"].with_suffix(".pub"))
    assert signing.state(folder).trusted  # signed with it
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]\n")
    found = signing.state(folder)
    assert found.state == signing.CHANGED and ".git/config" in found.detail, found


def test_an_archive_renamed_from_its_model_is_refused_at_once(tmp_path: Path) -> None:
    # TorchServe registers an archive under its MANIFEST.json modelName: serve of a.mar
    # holding digits_lenet_onnx waited its whole start-up timeout for a model "a".
    store = tmp_path / "store"
    store.mkdir()
    for name, inner in (("a", "digits_lenet_onnx"), ("digits_lenet_ts", "digits_lenet_ts")):
        with zipfile.ZipFile(store / f"{name}.mar", "w") as zf:
            zf.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": inner}}))
    ts_store.refuse_untied(store, ["digits_lenet_ts"])  # named as its model: no policy, fine
    with pytest.raises(ServeError, match=r"a\.mar holds the model 'digits_lenet_onnx' \(MAR-INF"):
        ts_store.refuse_untied(store, ["a", "digits_lenet_ts"])
