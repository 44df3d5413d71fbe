"""A crashed check's row says what the exception said, in one line (pipeline/verify/report.py
Row.crashed). A gRPC error's text opens with "<_InactiveRpcError of RPC that terminated
with:" alone on its line, which is all the report kept (a user's trial of `verify
--backend kserve` over gRPC): its status and details are what it says."""

from __future__ import annotations

import grpc
import pytest

from pipeline.verify.report import Row


def _grpc_error() -> grpc.RpcError:
    """A real one: a unary call to a loopback port nothing listens on."""
    with grpc.insecure_channel("127.0.0.1:9") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        try:
            call(b"", timeout=5)
        except grpc.RpcError as err:
            return err
    raise AssertionError("the call succeeded")


def test_a_grpc_error_gives_its_status_and_details() -> None:
    err = _grpc_error()
    assert str(err).splitlines()[0].startswith("<_InactiveRpcError")  # what was kept
    problem = Row.crashed("kserve/grpc/onnx", "golden", "y", err, 1e-5, 1e-4).comparison.problem
    assert "StatusCode.UNAVAILABLE" in problem and "<_InactiveRpcError" not in problem, problem


@pytest.mark.parametrize(
    ("err", "said"),
    [
        (RuntimeError("first\nsecond"), "raised RuntimeError: first"),
        (KeyError(), "raised KeyError: "),
    ],
)
def test_other_errors_give_their_first_line(err: BaseException, said: str) -> None:
    assert Row.crashed("b", "golden", "y", err, 1e-5, 1e-4).comparison.problem == said


def test_a_crashed_row_quotes_no_tolerance_it_was_never_held_to() -> None:
    # "boxes: raised TooLargeError: ... (atol 1e-05, rtol 0.0001) [crashed]" (a user's
    # detector trial): nothing was compared, and a detector is judged as "detections".
    said = Row.crashed("kserve/onnx", "golden", "detections", ValueError("x"), 1e-5, 1e-4)
    assert said.describe() == "kserve/onnx / golden / detections: raised ValueError: x [crashed]"
