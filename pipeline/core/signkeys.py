"""Signing keys: a new pair (`pipeline keygen`), and a private key checked before
model-signing takes it, so a key it cannot use is refused by its cause
(pipeline.core.signing signs and verifies)."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.errors import PipelineError


class SignatureError(PipelineError):
    """A version the trust policy refuses, or a key that cannot sign or verify."""


def keygen(private_key: Path) -> Path:
    """A new P-256 key pair: the private key at `private_key` (owner-only), the public key
    beside it as `<name>.pub`. Returns the public key's path."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private_key = Path(private_key)
    if private_key.suffix.lower() == ".pub" or private_key.name in ("", ".", ".."):
        raise SignatureError(
            f"--out {private_key}: name the private key's file (e.g. keys/publisher); the "
            "public key is written beside it as <name>.pub."
        )
    if private_key.is_dir():
        raise SignatureError(f"--out {private_key} is a folder; name the private key's file in it.")
    public = private_key.with_suffix(".pub")
    for path in (private_key, public):
        if path.exists():
            raise SignatureError(f"{path} exists; choose another name (keys are not replaced).")
    key = ec.generate_private_key(ec.SECP256R1())
    private_key.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(private_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return public


def check_private_key(private_key: Path, password: str | None) -> None:
    """Refuse, by its cause, a PEM key that cannot be opened with `password`: an encrypted
    key with no password or the wrong one (what the library reports as a key of the wrong
    kind)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = private_key.read_bytes()
    try:
        key = serialization.load_pem_private_key(
            pem, None if password is None else password.encode()
        )
    except TypeError as err:  # a password for a plain key, or none for an encrypted one
        if password is None:
            raise SignatureError(
                f"--sign: {private_key} is encrypted; give its password in an environment "
                "variable named by --key-password-env."
            ) from None
        raise SignatureError(f"--sign: {private_key}: {err}") from None
    except ValueError as err:
        if b"ENCRYPTED" in pem and password is not None:
            raise SignatureError(
                f"--sign: {private_key} could not be decrypted with the password given "
                "(--key-password-env): wrong password?"
            ) from None
        raise SignatureError(
            f"--sign: {private_key} is not a PEM private key model-signing takes (P-256, "
            f"P-384 or P-521; `pipeline keygen` makes one): {err}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):  # model-signing failed on RSA's
        raise SignatureError(
            f"--sign: {private_key} is not an elliptic-curve key ({type(key).__name__}); "
            "model-signing signs with one (P-256, P-384 or P-521; `pipeline keygen` makes one)."
        )
