"""The yardstick: the least a served ONNX model can cost, one thread, no framework.

aiohttp parses the Open Inference Protocol JSON body, ONNX Runtime runs the
session in the event loop's own thread (one intra-op thread), and the answer
is OIP JSON. Nothing else: no token, no batching, no validation. Bench starts
it as a script (`python yardstick_server.py --onnx F --name N --port P`); it
imports nothing from the pipeline, so what it measures is aiohttp + ONNX Runtime.
"""

import argparse
import json

import numpy as np
import onnxruntime as ort
from aiohttp import web

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
NAMES = {np.dtype(t): name for name, t in DTYPES.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--onnx", "--name", "--port"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(args.onnx, options, providers=["CPUExecutionProvider"])
    feeds = [i.name for i in session.get_inputs()]
    outs = [o.name for o in session.get_outputs()]

    async def infer(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        x = {
            name: np.asarray(t["data"], DTYPES[t["datatype"]]).reshape(t["shape"])
            for name, t in zip(feeds, body["inputs"], strict=True)
        }
        ys = session.run(outs, x)
        answer = [
            {
                "name": n,
                "shape": list(y.shape),
                "datatype": NAMES[y.dtype],
                "data": y.ravel().tolist(),
            }
            for n, y in zip(outs, ys, strict=True)
        ]
        return web.json_response({"model_name": args.name, "outputs": answer})

    async def ready(_: web.Request) -> web.Response:
        return web.Response()

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post(f"/v2/models/{args.name}/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    web.run_app(app, host="127.0.0.1", port=int(args.port), print=None, access_log=None)


if __name__ == "__main__":
    main()
