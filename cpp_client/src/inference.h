// Loading a TorchScript module and running it, with latency statistics.
#pragma once

#include <torch/script.h>

#include <string>
#include <vector>

#include "tensor_io.h"

namespace client {

struct LatencyStats {
  int runs = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0;
};

// Loads MODEL onto `device`; throws std::runtime_error naming the file on failure.
torch::jit::Module LoadModel(const std::string& path, const torch::Device& device);

// Runs one case; tuple and list outputs are flattened into a list of tensors.
// Throws std::runtime_error with the model's own message when the inputs do not fit.
Case RunCase(torch::jit::Module& module, const Case& inputs, const torch::Device& device);

// Times `repeat` runs of the first case after `warmup` untimed ones.
LatencyStats Time(torch::jit::Module& module, const Case& inputs, const torch::Device& device,
                  int warmup, int repeat);

}  // namespace client
