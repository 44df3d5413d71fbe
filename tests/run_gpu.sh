#!/usr/bin/env bash
# The gpu-marked tests on a GPU machine, with that machine's own Python and torch (tests/README.md,
# "On a GPU machine"). `make venv` is not run there: such a machine often has no network, so
# the project runs from this checkout (PYTHONPATH) on the torch it has.
#
#   bash tests/run_gpu.sh --pack DIR   # here, in a `make venv` checkout: copy the pure-Python
#                                      # packages a GPU image lacks (TorchServe's worker side,
#                                      # torch-model-archiver, torchinfo) into DIR
#   bash tests/run_gpu.sh [DIR]        # there: versions, then the gpu tests; DIR as packed
#
# Results go to $OUT (default /tmp/gpu-check): env.txt, pytest.log, junit.xml.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--pack" ]]; then
    dest=${2:?usage: run_gpu.sh --pack DIR}
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$dest" && mkdir -p "$dest"
    # TorchServe's frontend (a 44 MB jar) stays behind: these tests load workers without Java.
    for pkg in ts model_archiver torchinfo; do
        cp -r "$site/$pkg" "$dest/"
    done
    rm -rf "$dest/ts/frontend"
    find "$dest" -name __pycache__ -prune -exec rm -rf {} +
    du -sh "$dest"
    exit 0
fi

extra=${1:-.devcarry/site}
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${extra:+:$PWD/$extra}" PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$py" - <<'EOF'
import sys

import onnx
import onnxruntime
import torch
import torchvision

print("python", sys.version.split()[0])
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print("torchvision", torchvision.__version__, "onnx", onnx.__version__)
print("onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
EOF
    command -v nvcc && nvcc --version | tail -1
    cmake --version | head -1
} 2>&1 | tee "$out/env.txt"

# Whole files per worker: the session fixtures (the checkpoint, the exports, the C++ build)
# are built once and shared through tests/conftest.py's lock. test_worker_device is not
# gpu-marked (CI runs it on CPU); here its "auto" cases take the GPU.
timeout "${GPU_TESTS_TIMEOUT:-420}" "$py" -m pytest -p no:cacheprovider \
    -n "${GPU_TESTS_WORKERS:-4}" --dist loadfile --junitxml="$out/junit.xml" \
    tests/integration/test_gpu.py tests/integration/test_worker_device.py \
    tests/integration/test_training_modes.py::test_fp16_amp_with_grad_scaler_on_cuda \
    tests/integration/test_cpp_pt2.py::test_cuda_package_runs_with_device_cuda \
    2>&1 | tee "$out/pytest.log"
