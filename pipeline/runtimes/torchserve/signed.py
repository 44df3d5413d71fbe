"""TorchServe's archives of signed versions: the `.mar` TorchServe loads must be what
`pipeline archive` packs from the signed version folder, since the signature covers the
folder, not the archive built from it (SECURITY.md)."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

from pipeline.core import signing
from pipeline.core.manifest import GOLDEN_KEY, MANIFEST_NAME, read_manifest
from pipeline.runtimes.torchserve.archive import RUNTIME_DIR, handler_source
from pipeline.runtimes.torchserve.constants import ARCHIVE_INFO
from pipeline_runtime.files import sha256_file

# What archive writes besides the export's files and code: settings and provenance.
_SETTINGS = frozenset({"model-config.yaml", ARCHIVE_INFO, "MAR-INF/MANIFEST.json"})


def _member_sha256(zf: zipfile.ZipFile, name: str) -> str:
    digest = hashlib.sha256()
    with zf.open(name) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):  # an artifact may be large
            digest.update(chunk)
    return digest.hexdigest()


def differences(mar: Path, export_dir: Path, key: str) -> list[str]:
    """How `mar` differs from what `archive` packs from `export_dir` for format `key`: the
    artifact, manifest and golden I/O (by the manifest's sha256), the handler and the
    runtime package this installation writes, and nothing else that could run. [] when the
    archive is exactly that (its settings aside)."""
    manifest = read_manifest(export_dir)
    expected = {MANIFEST_NAME: sha256_file(Path(export_dir) / MANIFEST_NAME)}
    for k in (key, GOLDEN_KEY):
        record = manifest.artifacts.get(k)
        if record is None:
            return [f"archive.json names format {k!r}, which {export_dir} does not hold"]
        expected[Path(record.file).name] = record.sha256
    expected[f"{key}_handler.py"] = hashlib.sha256(handler_source(key).encode()).hexdigest()
    for path in RUNTIME_DIR.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            expected[f"{RUNTIME_DIR.name}/{path.relative_to(RUNTIME_DIR).as_posix()}"] = (
                sha256_file(path)
            )
    found: list[str] = []
    try:
        with zipfile.ZipFile(mar) as zf:
            held = {i.filename for i in zf.infolist() if not i.is_dir()}
            for name in sorted(held - _SETTINGS):
                if name not in expected:
                    found.append(f"{name} is not a file archive packs")
                elif _member_sha256(zf, name) != expected[name]:
                    found.append(f"{name} differs")
    except (OSError, zipfile.BadZipFile) as err:
        return [f"{mar.name} cannot be read as an archive ({err})"]
    found += [f"{name} is missing" for name in sorted(set(expected) - held)]
    return found


def to_rebuild(mar: Path, version_dir: Path, key: str, number: int) -> bool:
    """Whether `mar`, the archive of signed version `number` (in `version_dir`), must be
    built again from it: True when it differs, said on stderr with what differed."""
    found = differences(mar, version_dir, key)
    if found:
        kind = "signed version" if signing.signer_of(version_dir) else "version"
        print(
            f"warning: {mar} is not what archiving {kind} {number} gives "
            f"({'; '.join(found[:3])}): archived again from it",
            file=sys.stderr,
        )
    return bool(found)
