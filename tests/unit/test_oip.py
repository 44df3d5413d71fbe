"""pipeline_runtime.oip: every datatype through REST JSON, the binary extension and gRPC,
checked against kserve's own readers, writers and generated messages; malformed messages
are OipError; there is one datatype table."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from pipeline_runtime import codec, oip

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ks():
    """kserve's infer types and gRPC messages, imported with pytest's arguments hidden."""
    return oip.kserve_module("kserve.protocol.infer_type"), oip.kserve_module(oip.PB2)


def _sample(datatype: str) -> np.ndarray:
    """Values that test the datatype's edges: its extremes, signs and (for floats) fractions."""
    dtype = oip.dtype_of(datatype)
    if dtype == np.bool_:
        return np.array([[True, False, True]])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dtype)
    info = np.finfo(dtype)
    return np.array([[info.min, -0.0, info.max], [1 / 3, info.tiny, 7.5]], dtype=dtype)


DATATYPES = [d.name for d in oip.TABLE]


def _request(datatype: str) -> oip.Request:
    tensors = (oip.Tensor.from_array("x", _sample(datatype)), oip.Tensor.from_array("b", [1, 2]))
    return oip.Request(tensors, id="r1", parameters=dict(PARAMETERS))


PARAMETERS = {"binary_data_output": True, "priority": 3, "note": "x"}  # gRPC's three kinds


def _same_parameters(got: dict) -> None:
    assert got == PARAMETERS
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in PARAMETERS.items()}


def _same(got: dict[str, np.ndarray], sent: oip.Request) -> None:
    assert list(got) == [t.name for t in sent.inputs]
    for t in sent.inputs:
        want = t.as_numpy()
        assert got[t.name].dtype == want.dtype and got[t.name].shape == want.shape
        assert got[t.name].tobytes() == want.tobytes()  # bit-exact, -0.0 included


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_rest_round_trip(datatype: str, binary: bool) -> None:
    sent = _request(datatype)
    content, length = sent.to_rest(binary=binary)
    assert (length is None) == (not binary)
    back = oip.Request.from_rest(content, length)
    _same(back.arrays(), sent)
    assert back.id == "r1"
    _same_parameters(back.parameters)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_grpc_round_trip(ks, datatype: str) -> None:
    _, pb = ks
    sent = _request(datatype)
    message = sent.to_grpc()
    assert isinstance(message, pb.ModelInferRequest)
    # Through the wire format itself, not only the Python object.
    wire = pb.ModelInferRequest.FromString(message.SerializeToString())
    back = oip.Request.from_grpc(wire)
    _same(back.arrays(), sent)
    assert back.id == "r1"
    _same_parameters(back.parameters)
    answer = oip.Response(sent.inputs, model_name="m", id="a1")
    again = oip.Response.from_grpc(
        pb.ModelInferResponse.FromString(answer.to_grpc().SerializeToString())
    )
    _same(again.arrays(), sent)
    assert (again.model_name, again.id) == ("m", "a1")


def _kserve_case(ks, datatype: str, binary: bool) -> tuple[ModuleType, oip.Request]:
    if datatype == "FP16" and not binary:
        pytest.skip("kserve refuses FP16 in JSON (it has no JSON number for it)")
    return ks[0], _request(datatype)


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_kserve_reads_our_requests(ks, datatype: str, binary: bool) -> None:
    infer_type, sent = _kserve_case(ks, datatype, binary)
    content, length = sent.to_rest(binary=binary)
    if binary:
        theirs = infer_type.InferRequest.from_bytes(content, length, "m")
    else:
        from kserve.protocol.rest.v2_datamodels import InferenceRequest

        body = InferenceRequest.model_validate(json.loads(content))
        theirs = infer_type.InferRequest.from_inference_request(body, "m")
    _same({i.name: i.as_numpy() for i in theirs.inputs}, sent)
    grpc = infer_type.InferRequest.from_grpc(sent.to_grpc())
    _same({i.name: i.as_numpy() for i in grpc.inputs}, sent)


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_we_read_kservers_answers(ks, datatype: str, binary: bool) -> None:
    infer_type, sent = _kserve_case(ks, datatype, binary)
    outputs = []
    for t in sent.inputs:
        out = infer_type.InferOutput(name=t.name, shape=list(t.shape), datatype=t.datatype)
        out.set_data_from_numpy(t.as_numpy(), binary_data=binary)
        outputs.append(out)
    theirs = infer_type.InferResponse(
        response_id="1", model_name="m", infer_outputs=outputs, use_binary_outputs=binary
    )
    content, length = theirs.to_rest()
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    _same(oip.Response.from_rest(raw, length).arrays(), sent)
    _same(oip.Response.from_grpc(theirs.to_grpc()).arrays(), sent)


def test_grpc_typed_contents_are_read_when_nothing_is_raw(ks) -> None:
    _, pb = ks
    message = pb.ModelInferResponse(model_name="m")
    message.outputs.add(name="y", datatype="INT32", shape=[2]).contents.int_contents.extend([5, -6])
    got = oip.Response.from_grpc(message).arrays()["y"]
    assert got.dtype == np.int32 and got.tolist() == [5, -6]


def test_binary_reads_keep_the_bytes_and_write_no_lists() -> None:
    content, length = _request("FP32").to_rest(binary=True)
    header = json.loads(content[:length])
    assert all("data" not in i and i["parameters"]["binary_data_size"] for i in header["inputs"])
    back = oip.Request.from_rest(content, length)
    assert all(isinstance(t.data, bytes) for t in back.inputs)


_X = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", '


@pytest.mark.parametrize(
    ("header", "tail", "match"),
    [
        (_X + b'"nothing": 1}]}', None, "no 'data'"),
        (_X + b'"parameters": {"binary_data_size": 8}}]}', b"abcd", "8 bytes announced, 4 left"),
        (_X.replace(b"[1]", b"[2]") + b'"parameters": {"binary_data_size": 4}}]}', b"abcd",
         "4 bytes do not hold FP32"),
        (_X + b'"parameters": {"binary_data_size": 4}}]}', b"abcdEXTRA", "5 bytes after"),
        (_X + b'"parameters": {"binary_data_size": true}}]}', b"abcd", "binary_data_size"),
        (_X.replace(b'"FP32"', b'"NOPE"') + b'"data": [1]}]}', None, "'NOPE' is not one of"),
        (_X.replace(b'"FP32"', b'["FP32"]') + b'"data": [1]}]}', None, "is not one of"),
        (_X.replace(b"[1]", b'"x"') + b'"data": [1]}]}', None, "'shape' must be"),
        (_X.replace(b"[1]", b"[-1]") + b'"data": [1]}]}', None, "'shape' must be"),
        (_X.replace(b'"x"', b"3") + b'"data": [1]}]}', None, "'name' must be"),
        (_X + b'"data": 1}]}', None, "'data' must be a list"),
        (_X + b'"data": [1], "parameters": 3}]}', None, "'parameters' must be"),
        (b'{"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}', None, "needs"),
        (b'{"inputs": [3]}', None, "must be a JSON object"),
        (b'{"inputs": 3}', None, "needs 'inputs'"),
        (b'{"inputs": [], "outputs": [{"nom": "y"}]}', None, "'outputs' must be"),
        (b'{"inputs": [], "outputs": [{"name": "y", "parameters": [1]}]}', None, "'outputs' must"),
        (b'{"inputs": [], "id": 5}', None, "must be strings"),
        (b'{"inputs": [], "parameters": [1]}', None, "'parameters' must be"),
        (b"[1]", None, "needs 'inputs'"),
        (b"\xff\xfe", None, "not JSON"),
        (b'{"inputs": [], "parameters": {"a": NaN}', None, "not JSON"),
    ],
    ids=[
        "no-data", "short", "size-not-shape", "trailing", "size-type", "datatype",
        "datatype-type", "shape-type", "shape-negative", "name-type", "data-type",
        "parameters-type", "no-name", "tensor-type", "inputs-type", "outputs", "output-parameters",
        "id-type",
        "message-parameters", "not-a-dict", "not-utf8", "truncated",
    ],
)  # fmt: skip
def test_malformed_requests_are_oip_errors(header: bytes, tail: bytes | None, match: str) -> None:
    length = None if tail is None else len(header)
    with pytest.raises(oip.OipError, match=match):
        oip.Request.from_rest(header + (tail or b""), length)


@pytest.mark.parametrize("length", [0, -1, 3])
def test_a_header_length_outside_the_body_is_an_oip_error(length: int) -> None:
    with pytest.raises(oip.OipError, match="Inference-Header-Content-Length is"):
        oip.Request.from_rest(b"{}", length)


def test_data_that_does_not_match_its_shape_is_an_oip_error() -> None:
    body = {"outputs": [{"name": "y", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3]}]}
    response = oip.Response.from_json(body)  # JSON data is read when asked for
    with pytest.raises(oip.OipError, match="'y'"):
        response.arrays()
    body["outputs"][0]["data"] = ["a", "b", "c", "d"]
    with pytest.raises(oip.OipError, match="INT64"):
        oip.Response.from_json(body).arrays()


def test_datatypes_outside_the_table_are_refused_by_name() -> None:
    with pytest.raises(oip.DatatypeError, match="complex64"):
        oip.Tensor.from_array("z", np.zeros(2, np.complex64))
    with pytest.raises(oip.DatatypeError, match="BYTES"):
        oip.dtype_of("BYTES")
    with pytest.raises(oip.OipError, match="is not FP64"):
        oip.Tensor("x", "FP64", (2,), np.zeros(2, np.float32))
    with pytest.raises(oip.OipError, match="gRPC carries"):
        oip.Request((), parameters={"f": 1.5}).to_grpc()


def test_the_table_is_kserves_and_the_codecs() -> None:
    """One table: the codec's names are this module's objects, and it agrees with kserve's."""
    from kserve.constants.constants import GRPC_CONTENT_DATATYPE_MAPPINGS
    from kserve.utils.numpy_codec import from_np_dtype, to_np_dtype

    assert codec.V2_DATATYPES is oip.DATATYPES and codec.V2_NAMES is oip.NAMES
    for d in oip.TABLE:
        assert np.dtype(to_np_dtype(d.name)) == np.dtype(d.numpy)
        assert from_np_dtype(np.dtype(d.numpy)) == d.name
        assert GRPC_CONTENT_DATATYPE_MAPPINGS.get(d.name) == d.grpc_contents


def test_no_second_datatype_table() -> None:
    """No module outside oip.py spells out a datatype table: a dict, set, tuple or list
    holding two or more OIP datatype names (e.g. {"FP32": "float32", "INT64": "int64"})."""
    names = set(oip.DATATYPES)
    found = []
    for package in ("pipeline", "pipeline_runtime"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "pipeline_runtime" / "oip.py":
                continue
            if path.parent == ROOT / "pipeline" / "bench" / "peers" and path.stem.endswith(
                "_server"
            ):
                continue  # bench's peers: servers written as a user would, without our code
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Dict | ast.Set | ast.Tuple | ast.List):
                    strings = {
                        n.value
                        for n in ast.walk(node)
                        if isinstance(n, ast.Constant) and n.value in names
                    }
                    if len(strings) >= 2:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(strings)}")
    assert not found, f"datatype tables outside pipeline_runtime/oip.py: {found}"
