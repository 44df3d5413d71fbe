// pte_runner: runs an ExecuTorch .pte program on .npy inputs, writes its outputs as .npy
// and prints one JSON line of latency statistics. Links ExecuTorch's runtime, CPU kernels
// and XNNPACK delegate only: no LibTorch (what `pipeline verify --with-cpp` checks).
//
//   pte_runner --model model.pte --inputs DIR [--outputs DIR] [--warmup N] [--repeat N]
//
// DIR holds one folder per case (0/, 1/, ...), each with the inputs in forward() order
// (0.npy, 1.npy, ...); the outputs are written the same way. Exit codes: 2 bad arguments,
// 3 the program does not load (a missing operator is named on stderr by the runtime),
// 4 unreadable inputs, 5 a failed run, 6 unwritable outputs.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "npy.h"

namespace fs = std::filesystem;
using executorch::aten::ScalarType;
using executorch::extension::Module;
using executorch::runtime::EValue;

namespace {

constexpr int kArgsError = 2, kModelError = 3, kInputsError = 4, kRunError = 5,
              kOutputsError = 6;

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "pte_runner: %s\n", message.c_str());
  return code;
}

const std::map<std::string, ScalarType>& Dtypes() {
  static const std::map<std::string, ScalarType> kDtypes = {
      {"<f4", ScalarType::Float}, {"<f8", ScalarType::Double}, {"<f2", ScalarType::Half},
      {"<i8", ScalarType::Long},  {"<i4", ScalarType::Int},    {"<i2", ScalarType::Short},
      {"|i1", ScalarType::Char},  {"|u1", ScalarType::Byte},   {"|b1", ScalarType::Bool}};
  return kDtypes;
}

std::string DescrOf(ScalarType type) {
  for (const auto& [descr, t] : Dtypes()) {
    if (t == type) return descr;
  }
  throw std::runtime_error("an output of scalar type " + std::to_string(static_cast<int>(type)) +
                           " has no .npy dtype here");
}

// Sorted numerically: 10 after 9.
std::vector<fs::path> Numbered(const fs::path& dir, bool folders) {
  std::vector<std::pair<long, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string stem = entry.path().stem().string();
    if (stem.empty() || stem.find_first_not_of("0123456789") != std::string::npos) continue;
    if (folders ? entry.is_directory() : entry.path().extension() == ".npy") {
      found.emplace_back(std::stol(stem), entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> paths;
  for (auto& [index, path] : found) paths.push_back(path);
  return paths;
}

struct Case {
  std::vector<npy::Array> arrays;  // own the bytes the tensors point at
  std::vector<executorch::extension::TensorPtr> tensors;
  std::vector<EValue> values;
};

Case LoadCase(const fs::path& dir) {
  Case c;
  for (const auto& file : Numbered(dir, false)) c.arrays.push_back(npy::Read(file.string()));
  if (c.arrays.empty()) throw std::runtime_error(dir.string() + " holds no 0.npy");
  for (auto& a : c.arrays) {
    std::vector<executorch::aten::SizesType> sizes(a.shape.begin(), a.shape.end());
    c.tensors.push_back(
        executorch::extension::from_blob(a.data.data(), sizes, Dtypes().at(a.descr)));
  }
  for (auto& t : c.tensors) c.values.emplace_back(t);
  return c;
}

std::vector<npy::Array> Run(Module& module, const Case& c) {
  auto result = module.forward(c.values);
  if (!result.ok()) {
    throw std::runtime_error(std::string("forward failed: ") +
                             executorch::runtime::to_string(result.error()));
  }
  std::vector<npy::Array> outputs;
  for (const EValue& value : *result) {
    if (!value.isTensor()) throw std::runtime_error("an output is not a tensor");
    const auto& t = value.toTensor();
    npy::Array a;
    a.descr = DescrOf(t.scalar_type());
    for (auto size : t.sizes()) a.shape.push_back(size);
    const auto* bytes = static_cast<const uint8_t*>(t.const_data_ptr());
    a.data.assign(bytes, bytes + t.nbytes());
    outputs.push_back(std::move(a));
  }
  return outputs;
}

// A whole number of at least `min_value` (atoi read "abc" as 0 and "-5" as -5).
bool Count(const std::string& text, int min_value, int* out) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min_value) return false;
  *out = value;
  return true;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, inputs, outputs;
  int warmup = 0, repeat = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "usage: pte_runner --model FILE.pte --inputs DIR [--outputs DIR] [--warmup N] "
          "[--repeat N]\nDIR/<case>/<k>.npy: case <case>'s k-th input in forward() order.\n");
      return 0;
    }
    // An unknown flag is named as such, wherever it stands (last, it "needed a value").
    static const std::set<std::string> kFlags = {"--model", "--inputs", "--outputs", "--warmup",
                                                 "--repeat"};
    if (!kFlags.count(flag)) return Fail(kArgsError, "unknown flag " + flag + " (see --help)");
    if (i + 1 >= argc) return Fail(kArgsError, flag + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (flag == "--model") model = value;
    else if (flag == "--inputs") inputs = value;
    else if (flag == "--outputs") outputs = value;
    else if (!Count(value, flag == "--warmup" ? 0 : 1, flag == "--warmup" ? &warmup : &repeat))
      return Fail(kArgsError, flag + (flag == "--warmup" ? " must be 0 or more" : " must be at least 1"));
  }
  if (model.empty() || inputs.empty()) return Fail(kArgsError, "--model and --inputs are required");

  const auto load_start = std::chrono::steady_clock::now();
  Module module(model, Module::LoadMode::MmapUseMlockIgnoreErrors);
  if (const auto err = module.load_forward(); err != executorch::runtime::Error::Ok) {
    return Fail(kModelError, model + " does not load: " + executorch::runtime::to_string(err) +
                                 " (the runtime's log above names what is missing)");
  }
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start)
          .count();

  std::vector<Case> cases;
  try {
    for (const auto& dir : Numbered(inputs, true)) cases.push_back(LoadCase(dir));
    if (cases.empty()) throw std::runtime_error(inputs + " holds no case folder (0/, 1/, ...)");
  } catch (const std::exception& e) {
    return Fail(kInputsError, e.what());
  }
  std::vector<std::vector<npy::Array>> results;
  std::vector<double> times;
  try {
    for (size_t i = 0; i < cases.size(); ++i) {
      try {
        results.push_back(Run(module, cases[i]));
      } catch (const std::exception& e) {
        throw std::runtime_error("case " + std::to_string(i) + ": " + e.what());
      }
    }
    for (int i = 0; i < warmup; ++i) Run(module, cases.front());
    for (int i = 0; i < repeat; ++i) {
      const auto start = std::chrono::steady_clock::now();
      Run(module, cases.front());
      times.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
  } catch (const std::exception& e) {
    return Fail(kRunError, e.what());
  }
  if (!outputs.empty()) {
    try {
      for (size_t i = 0; i < results.size(); ++i) {
        const fs::path dir = fs::path(outputs) / std::to_string(i);
        fs::create_directories(dir);
        for (size_t k = 0; k < results[i].size(); ++k) {
          npy::Write((dir / (std::to_string(k) + ".npy")).string(), results[i][k]);
        }
      }
    } catch (const std::exception& e) {
      return Fail(kOutputsError, e.what());
    }
  }
  double sum = 0;
  for (double t : times) sum += t;
  std::printf(
      "{\"model\": \"%s\", \"runtime\": \"executorch\", \"cases\": %zu, \"runs\": %d, "
      "\"load_ms\": %.4f, \"p50_ms\": %.4f, \"p90_ms\": %.4f, \"p99_ms\": %.4f, "
      "\"mean_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f}\n",
      model.c_str(), cases.size(), repeat, load_ms, Percentile(times, 0.5),
      Percentile(times, 0.9), Percentile(times, 0.99), sum / times.size(),
      *std::min_element(times.begin(), times.end()), *std::max_element(times.begin(), times.end()));
  return 0;
}
