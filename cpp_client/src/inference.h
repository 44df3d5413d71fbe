// Loading a model (TorchScript or an AOTInductor .pt2 package) and running it,
// with latency statistics.
#pragma once

// Narrow headers, not <torch/torch.h>: see tensor_io.h.
#include <c10/core/Device.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor_io.h"

namespace client {

enum class ModelFormat { kTorchScript, kPt2 };

// "torchscript" or "pt2", as the JSON line reports it.
const char* FormatName(ModelFormat format);

// A file named *.pt2, or any zip archive holding data/aotinductor/, is an
// AOTInductor package; everything else is TorchScript.
ModelFormat DetectFormat(const std::string& path);

// A .pt2 package was compiled for another device than the one asked for.
class DeviceMismatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// dlopens the shared library at PATH with RTLD_NOW|RTLD_GLOBAL (its symbols, and the
// operators it registers, then serve the model loaded after it); throws
// std::runtime_error with dlerror()'s message when it cannot be loaded.
void LoadLibrary(const std::string& path);

// A loaded model: runs one case whose tensors are already on the model's device.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual Case Run(const Case& inputs) = 0;
  // forward()'s argument names, in order, where the format keeps them (TorchScript's
  // schema); empty otherwise (an AOTInductor package takes its inputs by position).
  virtual std::vector<std::string> InputNames() const { return {}; }
};

// Loads MODEL onto `device`; throws std::runtime_error naming the file on failure,
// DeviceMismatchError when a .pt2 package was compiled for another device.
// A .pt2 package is loaded with AOTI_RUNTIME_CHECK_INPUTS=1 (unless that variable
// is already set) so that inputs of the wrong dtype or shape raise an error
// instead of running the compiled kernels out of bounds.
std::unique_ptr<Runner> LoadModel(const std::string& path, ModelFormat format,
                                  const c10::Device& device);

struct LatencyStats {
  int runs = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0;
};

// Runs one case; tuple, list and dict outputs are flattened into a list of tensors
// (dicts in insertion order: the manifest's output order).
// Throws std::runtime_error with the model's own message when the inputs do not fit.
Case RunCase(Runner& runner, const Case& inputs, const c10::Device& device);

// Times `repeat` runs of the first case after `warmup` untimed ones.
LatencyStats Time(Runner& runner, const Case& inputs, const c10::Device& device, int warmup,
                  int repeat);

}  // namespace client
