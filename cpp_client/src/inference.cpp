#include "inference.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace client {

namespace {

void Flatten(const c10::IValue& value, Case* out) {
  if (value.isTensor()) {
    out->push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& item : value.toTupleRef().elements()) Flatten(item, out);
  } else if (value.isList()) {
    for (const auto& item : value.toListRef()) Flatten(item, out);
  } else {
    throw std::runtime_error(std::string("unsupported model output type ") + value.tagKind());
  }
}

// The last non-empty line of an interpreter error: the cause, without the
// TorchScript traceback that precedes it.
std::string RootCause(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const auto pos = text.rfind('\n');
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

double Percentile(std::vector<double> sorted, double q) {
  // Nearest-rank on sorted samples: the smallest value with at least q of the runs at or below it.
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace

torch::jit::Module LoadModel(const std::string& path, const torch::Device& device) {
  try {
    torch::jit::Module module = torch::jit::load(path, device);
    module.eval();
    return module;
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot load TorchScript model " + path + ": " +
                             e.what_without_backtrace());
  }
}

Case RunCase(torch::jit::Module& module, const Case& inputs, const torch::Device& device) {
  std::vector<c10::IValue> args;
  args.reserve(inputs.size());
  for (const auto& t : inputs) args.emplace_back(t.to(device));
  c10::InferenceMode guard;
  try {
    Case outputs;
    Flatten(module.forward(args), &outputs);
    return outputs;
  } catch (const std::exception& e) {  // c10::Error, or a JIT exception from the interpreter
    std::string shapes;
    for (const auto& t : inputs) {
      shapes += (shapes.empty() ? "" : ", ") + c10::str(t.sizes()) + " " + std::string(c10::toString(t.scalar_type()));
    }
    throw std::runtime_error("the model rejected inputs [" + shapes + "]: " + RootCause(e));
  }
}

LatencyStats Time(torch::jit::Module& module, const Case& inputs, const torch::Device& device,
                  int warmup, int repeat) {
  for (int i = 0; i < warmup; ++i) RunCase(module, inputs, device);
  Synchronize(device);
  std::vector<double> ms;
  ms.reserve(repeat);
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    RunCase(module, inputs, device);
    Synchronize(device);
    const auto stop = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  LatencyStats stats;
  stats.runs = repeat;
  stats.p50_ms = Percentile(ms, 0.50);
  stats.p90_ms = Percentile(ms, 0.90);
  stats.p99_ms = Percentile(ms, 0.99);
  stats.mean_ms = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  stats.min_ms = ms.front();
  stats.max_ms = ms.back();
  return stats;
}

}  // namespace client
