"""The manifests `pipeline deploy kserve` writes, checked against KServe's CRD schema."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from pipeline.runtimes.kserve import manifests as m
from pipeline.runtimes.kserve.config import RuntimeConfig
from pipeline.runtimes.kserve.validate import (
    ManifestError,
    check,
    crd_schema,
    errors,
    schema_errors,
)
from pipeline.runtimes.torchserve import properties
from pipeline.serving import runtime


@pytest.fixture
def config(tmp_path: Path) -> m.DeployConfig:
    return m.DeployConfig(model="digits_lenet", export_dir=tmp_path / "e", out=tmp_path / "o")


def _all(config: m.DeployConfig) -> dict[str, dict]:
    return {
        "cpu": m.runtime_isvc(config),
        "gpu": m.runtime_isvc(config, gpu=True),
        "torchserve": m.torchserve_isvc(config),
    }


def test_vendored_schema_is_kserve_v1beta1() -> None:
    schema = crd_schema()
    assert set(schema["properties"]) >= {"apiVersion", "kind", "metadata", "spec", "status"}
    assert "predictor" in schema["properties"]["spec"]["properties"]
    source = Path(m.__file__).parent / "schema" / "SOURCE.md"
    assert "1fb781055dd1567164358233e1125142ca6ef1fe" in source.read_text()


@pytest.mark.parametrize("which", ["cpu", "gpu", "torchserve"])
def test_generated_manifests_validate(config: m.DeployConfig, which: str) -> None:
    doc = _all(config)[which]
    assert errors(doc) == []
    check(doc)  # does not raise


def test_runtime_isvc_fields(config: m.DeployConfig) -> None:
    pred = m.runtime_isvc(config)["spec"]["predictor"]
    assert (pred["minReplicas"], pred["maxReplicas"]) == (1, 3)
    assert (pred["scaleMetric"], pred["scaleTarget"]) == ("cpu", 70)
    (c,) = pred["containers"]
    assert c["name"] == "kserve-container"
    assert {"name": "PROTOCOL", "value": "v2"} in c["env"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert [p["containerPort"] for p in c["ports"]] == [8080, 8081]
    assert set(c["resources"]["requests"]) == set(c["resources"]["limits"]) == {"cpu", "memory"}
    gpu = m.runtime_isvc(config, gpu=True)["spec"]["predictor"]["containers"][0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["image"].endswith("-gpu")


def test_protocol_version_is_not_a_container_field(config: m.DeployConfig) -> None:
    """The CRD has protocolVersion on `model` only: a custom container says v2 via env."""
    doc = m.runtime_isvc(config)
    doc["spec"]["predictor"]["containers"][0]["protocolVersion"] = "v2"
    assert any("protocolVersion" in e for e in schema_errors(doc))


def test_torchserve_isvc_fields(config: m.DeployConfig) -> None:
    model = m.torchserve_isvc(config)["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "pytorch"}
    assert model["protocolVersion"] == "v2"
    assert model["storageUri"] == "pvc://models/digits-lenet"
    assert model["runtimeVersion"] == m.DEFAULT_TORCHSERVE_IMAGE_TAG
    assert model["args"] == ["--disable-token-auth", "--enable-model-api"]


def test_unknown_field_fails_with_its_path(config: m.DeployConfig) -> None:
    doc = m.runtime_isvc(config)
    doc["spec"]["predictor"]["minReplica"] = 2  # typo
    with pytest.raises(ManifestError) as err:
        check(doc, what="inferenceservice.yaml")
    text = str(err.value)
    assert "inferenceservice.yaml" in text
    assert "spec/predictor" in text and "'minReplica' was unexpected" in text
    # The CRD itself is open: only the strict (kubectl --validate=strict) check sees it.
    assert schema_errors(doc, strict=False) == []


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("spec", "predictor", "maxReplicas"), "three", "is not of type 'integer'"),
        (("spec", "predictor", "maxReplicas"), 2**40, "is not a 'int32'"),
        (("spec", "predictor", "scaleMetric"), "gpu", "is not one of"),
        (("spec", "predictor", "containers"), {"name": "x"}, "is not of type 'array'"),
        (("metadata", "name"), "Digits_LeNet", "metadata/name"),
        (("spec", "predictor", "minReplicas"), 5, "exceeds maxReplicas"),
        (("spec", "predictor", "scaleTarget"), 150, "1 to 100"),
        # What the API server refuses and the schema leaves open (a user's trial: all three
        # were written, and kubectl or docker would have refused them).
        (("metadata", "namespace"), "Bad_NS", "'Bad_NS' must be a DNS label"),
        (("spec", "predictor", "containers", 0, "image"), "bad image", "is no image reference"),
        (
            ("spec", "predictor", "containers", 0, "resources", "requests", "cpu"),
            "3",
            "the cpu request 3 is over its limit 2",
        ),
    ],
)
def test_broken_manifest_fails(
    config: m.DeployConfig, path: tuple, value: object, says: str
) -> None:
    doc = copy.deepcopy(m.runtime_isvc(config))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    found = errors(doc)
    assert any(says in e for e in found), found


def test_cpu_quantity_must_be_a_string(config: m.DeployConfig) -> None:
    doc = m.runtime_isvc(config)
    doc["spec"]["predictor"]["containers"][0]["resources"]["limits"]["cpu"] = 0.5
    assert any("resources/limits/cpu" in e for e in errors(doc))


def test_isvc_name_is_dns_safe() -> None:
    assert m.isvc_name("digits_lenet") == "digits-lenet"
    assert m.isvc_name("torchvision:resnet18") == "torchvision-resnet18"
    assert m.isvc_name("my/pkg/9model.py:Net") == "model-net"


def test_runtime_config_round_trips(config: m.DeployConfig, tmp_path: Path) -> None:
    path = tmp_path / "kserve.json"
    path.write_text(json.dumps(m.runtime_config(config)))
    rc = RuntimeConfig.read(path)
    assert (rc.host, rc.http_port, rc.grpc_port) == ("0.0.0.0", 8080, 8081)
    (served,) = rc.models
    assert (served.name, served.export_dir, served.format) == (
        "digits_lenet",
        "/srv/export",
        "torchscript",
    )


def test_dockerfile_runs_the_runtime(config: m.DeployConfig) -> None:
    text = m.dockerfile(config)
    assert 'CMD ["python", "-m", "pipeline.runtimes.kserve.runtime", "/srv/kserve.json"]' in text
    assert "COPY export/ /srv/export/" in text and "COPY kserve.json /srv/kserve.json" in text
    assert "USER 1000" in text


def test_the_lean_images_gpu_build_swaps_in_onnx_runtimes_cuda_package(
    config: m.DeployConfig, tmp_path: Path
) -> None:
    """The Dockerfile's own edit of the requirements, run here by a shell as `docker build`
    runs it, with and without the GPU build's argument (no Docker on this machine)."""
    import re
    import subprocess

    from packaging.requirements import Requirement

    from pipeline.runtimes.kserve.leanimage import EXTRA, REQUIREMENTS_FILE, requirements

    text = m.dockerfile(config, torch_free=True)
    assert f'--build-arg "ORT_PACKAGE={m.ORT_GPU_PACKAGE}"' in text
    assert "ARG ORT_PACKAGE=onnxruntime\n" in text
    (edit,) = re.findall(r"RUN (sed -i .*?) \\\n", text)
    pinned = requirements(Path(__file__).parents[2] / "pyproject.toml", EXTRA)
    (cpu,) = [Requirement(r) for r in pinned if Requirement(r).name == "onnxruntime"]
    for package, expected in [
        ("onnxruntime", "onnxruntime"),
        (m.ORT_GPU_PACKAGE, "onnxruntime-gpu"),
    ]:
        folder = tmp_path / expected / "opt" / "pipeline"
        folder.mkdir(parents=True)
        (folder / REQUIREMENTS_FILE).write_text("\n".join(pinned) + "\n")
        script = edit.replace("/opt/pipeline/", f"{folder}/")
        subprocess.run(["sh", "-c", script], env={"ORT_PACKAGE": package}, check=True)
        edited = [Requirement(r) for r in (folder / REQUIREMENTS_FILE).read_text().split()]
        (ort,) = [r for r in edited if r.name.startswith("onnxruntime")]
        assert ort.name == expected and ort.specifier == cpu.specifier  # the same version
        assert len(edited) == len(pinned)
    assert ort.extras == {"cuda", "cudnn"}


def _packaged_properties(envelope: bool = False) -> dict[str, str]:
    """config.properties as `deploy kserve` writes it: asked of the runtime that packages
    KServe's `pytorch` format (TorchServe), through the Packaging capability."""
    (packaging,) = [r.packaging for r in runtime.all_runtimes() if r.packaging]
    files = packaging.layout_files("digits_lenet_ts", envelope=envelope)
    assert list(files) == ["config/config.properties"]
    return properties.parse(files["config/config.properties"])


def test_torchserve_properties() -> None:
    props = _packaged_properties()
    # what the KServe wrapper in the torchserve-kfs image reads
    assert {"inference_address", "management_address", "model_store", "model_snapshot"} <= set(
        props
    )
    snapshot = json.loads(props["model_snapshot"])  # one line of JSON
    entry = snapshot["models"]["digits_lenet_ts"]["1.0"]
    assert entry["batchSize"] == 1 and entry["marName"] == "digits_lenet_ts.mar"
    assert props["enable_envvars_config"] == "false" and "service_envelope" not in props
    on = _packaged_properties(envelope=True)
    assert on["service_envelope"] == "kservev2" and on["enable_envvars_config"] == "true"


def test_cli_registers_deploy_kserve(tmp_path: Path) -> None:
    from pipeline.cli.deploy import add_deploy_command

    parser = argparse.ArgumentParser(prog="pipeline")
    parser.add_argument("--artifacts-dir", type=Path)
    add_deploy_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["deploy", "kserve", "--model", "digits_lenet", "--out", str(tmp_path)]
    )
    assert (args.target, args.model, args.out, args.max_replicas) == (
        "kserve",
        "digits_lenet",
        tmp_path,
        3,
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["deploy", "kserve", "--model", "digits_lenet"])  # --out is required


def test_a_storage_uri_without_a_scheme_is_refused_and_the_readme_names_the_namespace(
    tmp_path: Path,
) -> None:
    """`deploy kserve --storage-uri notauri` wrote a manifest KServe's storage initializer
    cannot read; with --namespace, the README's `kubectl get` looked in the current one."""
    from pipeline.core.errors import PipelineError
    from pipeline.runtimes.kserve.deploy import _readme

    with pytest.raises(PipelineError, match="--storage-uri 'notauri' is no URI"):
        m.DeployConfig(
            model="digits_lenet", export_dir=tmp_path, out=tmp_path, storage_uri="notauri"
        )
    config = m.DeployConfig(model="digits_lenet", export_dir=tmp_path, out=tmp_path, namespace="ml")
    text = _readme(config, "digits_lenet_ts")
    assert "kubectl get inferenceservice -n ml digits-lenet   #" in text
    assert "kubectl get inferenceservice -n ml digits-lenet-torchserve   #" in text
