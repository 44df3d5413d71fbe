"""LitServe serving an ONNX file through ONNX Runtime, for bench's peer rows.

A LitAPI whose decode_request/encode_response speak the Open Inference
Protocol's JSON (the same bodies the other servers get), on the OIP route, so
the same client measures it. Batching on: up to `--max-batch-size` requests
per session run, collected for at most `--batch-timeout` seconds. Bench starts
it as a script and stops its process group; it imports nothing from the pipeline.
"""

import argparse
from typing import Any

import litserve as ls
import numpy as np
import onnxruntime as ort

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
NAMES = {np.dtype(t): name for name, t in DTYPES.items()}


class OnnxAPI(ls.LitAPI):
    def __init__(self, onnx: str, name: str, threads: int, **kw: Any) -> None:
        super().__init__(api_path=f"/v2/models/{name}/infer", **kw)
        self.onnx, self.name, self.threads = onnx, name, threads

    def setup(self, device: str) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        # As the KServe runtime's sessions: no spin-waiting on cores the HTTP side needs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(self.onnx, options, providers=["CPUExecutionProvider"])
        self.feeds = [i.name for i in self.session.get_inputs()]
        self.outs = [o.name for o in self.session.get_outputs()]

    def decode_request(self, request: dict) -> list[np.ndarray]:
        return [
            np.asarray(t["data"], DTYPES[t["datatype"]]).reshape(t["shape"])
            for t in request["inputs"]
        ]

    def batch(self, inputs: list[list[np.ndarray]]) -> list[np.ndarray]:
        return [np.concatenate(parts) for parts in zip(*inputs, strict=True)]

    def predict(self, x: list[np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.outs, dict(zip(self.feeds, x, strict=True)))

    def unbatch(self, output: list[np.ndarray]) -> list[list[np.ndarray]]:
        return [[y[i : i + 1] for y in output] for i in range(len(output[0]))]

    def encode_response(self, output: list[np.ndarray]) -> dict:
        answer = [
            {
                "name": n,
                "shape": list(y.shape),
                "datatype": NAMES[y.dtype],
                "data": y.ravel().tolist(),
            }
            for n, y in zip(self.outs, output, strict=True)
        ]
        return {"model_name": self.name, "outputs": answer}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--onnx", "--name", "--port"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=1)
    parser.add_argument("--batch-timeout", type=float, default=0.0)
    parser.add_argument("--fast-queue", action="store_true")
    args = parser.parse_args()
    api = OnnxAPI(
        args.onnx,
        args.name,
        args.threads,
        max_batch_size=args.max_batch_size,
        batch_timeout=args.batch_timeout,
    )
    server = ls.LitServer(
        api, accelerator="cpu", workers_per_device=args.workers, fast_queue=args.fast_queue
    )
    server.run(
        host="127.0.0.1", port=int(args.port), log_level="warning", generate_client_file=False
    )


if __name__ == "__main__":
    main()
