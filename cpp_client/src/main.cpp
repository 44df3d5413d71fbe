// run_torchscript: run a TorchScript artifact or an AOTInductor .pt2 package
// from C++ and write its outputs.
// Exit codes: 0 ok, 2 usage, 3 model cannot be loaded, 4 inputs cannot be read,
// 5 the model rejected the inputs, 6 outputs cannot be written, 7 bad device
// (or a .pt2 package compiled for another device), 8 a --load-library cannot be loaded.

// The few LibTorch headers this file needs, not <torch/torch.h> (build time).
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <stdexcept>

#include "args.h"
#include "inference.h"
#include "tensor_io.h"

namespace {

constexpr int kUsageError = 2;
constexpr int kModelError = 3;
constexpr int kInputsError = 4;
constexpr int kRunError = 5;
constexpr int kOutputsError = 6;
constexpr int kDeviceError = 7;
constexpr int kLibraryError = 8;

std::string JsonEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

int Fail(int code, const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::string error;
  const auto args = client::ParseArgs(argc, argv, &error);
  if (!args && error.empty()) {  // --help: asked for, so on stdout (`--help | less` works)
    std::cout << client::Usage(argv[0]);
    return 0;
  }
  if (!args) {
    std::cerr << "error: " << error << "\n" << client::Usage(argv[0]);
    return kUsageError;
  }

  // Before anything else: a library may register operators (torchvision::nms) the model needs.
  for (const auto& library : args->load_libraries) {
    try {
      client::LoadLibrary(library);
    } catch (const std::exception& e) {
      return Fail(kLibraryError, e.what());
    }
  }

  c10::Device device(c10::kCPU);
  try {
    device = c10::Device(args->device);
  } catch (const c10::Error&) {
    return Fail(kDeviceError, "unknown --device '" + args->device + "'; use cpu, cuda or cuda:N");
  }
  if (device.is_cuda() && !torch::cuda::is_available()) {
    return Fail(kDeviceError, "--device " + args->device + " asked for, but CUDA is not available");
  }
  if (device.is_cuda() && device.has_index() &&
      device.index() >= static_cast<int>(torch::cuda::device_count())) {
    return Fail(kDeviceError, "--device " + args->device + " does not exist");
  }
  if (device.is_cuda()) {
    // Float32 computed in float32, as the Python runners do (runners.full_float32): whether
    // cuDNN takes TF32 depends on the algorithm it picks, and the golden outputs are float32.
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  if (args->threads > 0) at::set_num_threads(args->threads);

  const client::ModelFormat format = client::DetectFormat(args->model);
  std::unique_ptr<client::Runner> model;
  try {
    model = client::LoadModel(args->model, format, device);
  } catch (const client::DeviceMismatchError& e) {
    return Fail(kDeviceError, e.what());
  } catch (const std::exception& e) {
    return Fail(kModelError, e.what());
  }
  std::vector<client::Case> cases;
  try {
    // A {name: tensor} file's names: bound to forward()'s (a TorchScript file names them), or
    // to the golden.pt beside the model (a .pt2 package records its inputs by position only).
    std::vector<std::string> keys;
    cases = client::LoadCases(args->inputs, &keys);
    if (!keys.empty())
      cases.front() = client::BindByName(cases.front(), keys,
                                         {model->InputNames(), client::GoldenNames(args->model)});
  } catch (const std::exception& e) {
    return Fail(kInputsError, e.what());
  }

  std::vector<client::Case> outputs;
  client::LatencyStats stats;
  try {
    for (size_t i = 0; i < cases.size(); ++i) {
      try {
        outputs.push_back(client::RunCase(*model, cases[i], device));
      } catch (const std::exception& e) {
        throw std::runtime_error("case " + std::to_string(i) + " of " + args->inputs + ": " +
                                 e.what());
      }
    }
    stats = client::Time(*model, cases.front(), device, args->warmup, args->repeat);
  } catch (const std::exception& e) {
    return Fail(kRunError, e.what());
  }
  if (!args->outputs.empty()) {
    try {
      client::SaveCases(args->outputs, outputs);
    } catch (const std::exception& e) {
      return Fail(kOutputsError, e.what());
    }
  }
  std::printf(
      "{\"model\": \"%s\", \"format\": \"%s\", \"device\": \"%s\", \"threads\": %d, "
      "\"cases\": %zu, \"runs\": %d, \"p50_ms\": %.4f, \"p90_ms\": %.4f, \"p99_ms\": %.4f, "
      "\"mean_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f}\n",
      JsonEscape(args->model).c_str(), client::FormatName(format), device.str().c_str(),
      at::get_num_threads(), cases.size(), stats.runs, stats.p50_ms, stats.p90_ms, stats.p99_ms,
      stats.mean_ms, stats.min_ms, stats.max_ms);
  return 0;
}
