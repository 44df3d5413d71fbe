// pte_runner: runs an ExecuTorch .pte program on .npy inputs, writes its outputs as .npy
// and prints one JSON line of latency statistics. Links ExecuTorch's runtime, CPU kernels
// and XNNPACK delegate only: no LibTorch (what `pipeline verify --with-cpp` checks).
//
//   pte_runner --model model.pte --inputs DIR [--outputs DIR] [--warmup N] [--repeat N]
//
// DIR holds one folder per case (0/, 1/, ...), each with the inputs in forward() order
// (0.npy, 1.npy, ...); each case's outputs go to a folder of the same name, row-major
// whatever dim order the program leaves them in. Inputs are checked against the program's
// input meta (count, dtype, rank, sizes) before anything runs. Exit codes: 2 bad arguments,
// 3 the program does not load (a missing operator is named on stderr by the runtime),
// 4 unreadable inputs or ones the program does not take, 5 a failed run, 6 unwritable
// outputs.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// The numbered entries of `dir` (folders, or .npy files), sorted numerically: 10 after 9.
// Names are kept: a case's outputs go to a folder of its own name, not its rank.
std::vector<std::pair<long, fs::path>> Numbered(const fs::path& dir, bool folders) {
  std::vector<std::pair<long, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const fs::path& path = entry.path();
    const std::string stem = folders ? path.filename().string() : path.stem().string();
    // Nine digits at most: stol cannot overflow, and no real case count comes near.
    if (stem.empty() || stem.size() > 9 ||
        stem.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    if (folders ? entry.is_directory() : entry.path().extension() == ".npy") {
      found.emplace_back(std::stol(stem), entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 1; i < found.size(); ++i) {
    if (found[i].first == found[i - 1].first) {  // "1" and "01": which one is meant?
      throw std::runtime_error(dir.string() + " holds both " +
                               found[i - 1].second.filename().string() + " and " +
                               found[i].second.filename().string());
    }
  }
  return found;
}

// numpy has no bfloat16: such an input is read from a float32 .npy (rounded to nearest
// even, exact for values that were bfloat16) and such an output written as float32 (exact).
std::vector<uint8_t> ToBfloat16(const std::vector<uint8_t>& f32) {
  std::vector<uint8_t> out(f32.size() / 2);
  for (size_t i = 0; i < f32.size() / 4; ++i) {
    uint32_t bits;
    std::memcpy(&bits, f32.data() + 4 * i, 4);
    const bool nan = (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu);
    const uint16_t half = nan ? static_cast<uint16_t>((bits >> 16) | 0x40)
                              : static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
    std::memcpy(out.data() + 2 * i, &half, 2);
  }
  return out;
}

std::vector<uint8_t> FromBfloat16(const std::vector<uint8_t>& bf16) {
  std::vector<uint8_t> out(bf16.size() * 2);
  for (size_t i = 0; i < bf16.size() / 2; ++i) {
    uint16_t half;
    std::memcpy(&half, bf16.data() + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    std::memcpy(out.data() + 4 * i, &bits, 4);
  }
  return out;
}

std::string Shape(const std::vector<int64_t>& sizes) {
  std::string text = "(";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + (sizes.size() == 1 ? ",)" : ")");
}

// Element strides (row-major over `dim_order`: its last dim is the innermost).
std::vector<int64_t> StridesOf(const std::vector<int64_t>& sizes,
                               const std::vector<uint8_t>& dim_order) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t k = dim_order.size(); k-- > 1;) {
    strides[dim_order[k - 1]] = strides[dim_order[k]] * sizes[dim_order[k]];
  }
  return strides;
}

bool Contiguous(const std::vector<uint8_t>& dim_order) {
  for (size_t i = 0; i < dim_order.size(); ++i) {
    if (dim_order[i] != i) return false;
  }
  return true;
}

// Copies every element between a row-major buffer and a strided one (element strides), in
// the direction `to_strided` says: .npy is row-major, a program's tensor may not be.
void Permute(const uint8_t* from, uint8_t* to, const std::vector<int64_t>& sizes,
             const std::vector<int64_t>& strides, size_t item, bool to_strided) {
  int64_t count = 1;
  for (auto size : sizes) count *= size;
  std::vector<int64_t> index(sizes.size(), 0);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t offset = 0;
    for (size_t d = 0; d < sizes.size(); ++d) offset += index[d] * strides[d];
    const uint8_t* src = to_strided ? from + flat * item : from + offset * item;
    uint8_t* dst = to_strided ? to + offset * item : to + flat * item;
    std::copy(src, src + item, dst);
    for (size_t d = sizes.size(); d-- > 0;) {  // the next row-major index
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

// What the program takes as input `k`: dtype, dim order, the largest size of each dim and
// which dims are fixed. MethodMeta records a tensor's planned (largest) sizes, not which
// dims may vary; `pipeline export` adds the constant method below saying so (every dim of
// every input in order: its size when fixed, -1 when dynamic). Without it (a .pte made
// elsewhere) a size under a fixed one is left to the runtime, which refuses it only for a
// fully static input.
const char kInputSizesMethod[] = "pipeline_input_sizes";  // pipeline/formats/pte.py's

struct Expected {
  ScalarType type;
  std::vector<int64_t> sizes;
  std::vector<uint8_t> dim_order;
  std::vector<bool> fixed;
};

void ReadFixed(Module& module, std::vector<Expected>& inputs) {
  const auto names = module.method_names();
  if (!names.ok() || !names->count(kInputSizesMethod)) return;
  const auto sizes = module.execute(kInputSizesMethod);
  size_t dims = 0;
  for (const auto& e : inputs) dims += e.sizes.size();
  if (!sizes.ok() || sizes->size() != dims) {
    throw std::runtime_error(std::string("the program's ") + kInputSizesMethod +
                             " method does not list one size per input dim");
  }
  size_t at = 0;
  for (auto& e : inputs) {
    for (size_t d = 0; d < e.sizes.size(); ++d, ++at) {
      const EValue& size = (*sizes)[at];
      if (!size.isInt()) throw std::runtime_error(std::string(kInputSizesMethod) + " is not ints");
      e.fixed.push_back(size.toInt() >= 0);
      if (size.toInt() >= 0) e.sizes[d] = size.toInt();
    }
  }
}

std::vector<Expected> ExpectedInputs(Module& module) {
  const auto meta = module.method_meta("forward");
  if (!meta.ok()) throw std::runtime_error("the program has no forward method meta");
  std::vector<Expected> inputs;
  for (size_t k = 0; k < meta->num_inputs(); ++k) {
    const auto tag = meta->input_tag(k);
    if (!tag.ok() || *tag != executorch::runtime::Tag::Tensor) {
      throw std::runtime_error("the program's input " + std::to_string(k) +
                               " is not a tensor; the runner passes tensors only");
    }
    const auto info = meta->input_tensor_meta(k);
    if (!info.ok()) {
      throw std::runtime_error("no meta for the program's input " + std::to_string(k));
    }
    Expected e{info->scalar_type(), {}, {}, {}};
    for (auto size : info->sizes()) e.sizes.push_back(size);
    for (auto d : info->dim_order()) e.dim_order.push_back(d);
    inputs.push_back(std::move(e));
  }
  ReadFixed(module, inputs);
  return inputs;
}

struct Case {
  std::string name;                // the folder's name, and its outputs' folder's
  std::vector<npy::Array> arrays;  // own the bytes the tensors point at
  std::vector<executorch::extension::TensorPtr> tensors;
  std::vector<EValue> values;
};

Case LoadCase(const fs::path& dir, const std::vector<Expected>& expected) {
  Case c;
  c.name = dir.filename().string();
  const auto files = Numbered(dir, false);
  // In forward() order by name: a missing k would shift every later input into its place.
  for (size_t k = 0; k < files.size(); ++k) {
    if (files[k].first != static_cast<long>(k)) {
      throw std::runtime_error(dir.string() + " has no " + std::to_string(k) + ".npy (it holds " +
                               files[k].second.filename().string() + ")");
    }
  }
  if (files.size() != expected.size()) {
    throw std::runtime_error(dir.string() + " holds " + std::to_string(files.size()) +
                             " input(s) (0.npy, ...); the program takes " +
                             std::to_string(expected.size()));
  }
  for (const auto& [index, file] : files) c.arrays.push_back(npy::Read(file.string()));
  for (size_t k = 0; k < c.arrays.size(); ++k) {
    npy::Array& a = c.arrays[k];
    const Expected& e = expected[k];
    const std::string file = (dir / (std::to_string(k) + ".npy")).string();
    ScalarType type = Dtypes().at(a.descr);
    size_t item = npy::ItemSize(a.descr);
    if (type == ScalarType::Float && e.type == ScalarType::BFloat16) {
      a.data = ToBfloat16(a.data);
      type = ScalarType::BFloat16;
      item = 2;
    }
    if (type != e.type) {
      throw std::runtime_error(file + " is " + a.descr + "; the program's input " +
                               std::to_string(k) + " is " + executorch::runtime::toString(e.type) +
                               (e.type == ScalarType::BFloat16
                                    ? " (give it as float32: numpy has no bfloat16)"
                                    : ""));
    }
    bool fits = a.shape.size() == e.sizes.size();
    for (size_t d = 0; fits && d < a.shape.size(); ++d) {
      fits = e.fixed.empty() || !e.fixed[d] ? a.shape[d] <= e.sizes[d] : a.shape[d] == e.sizes[d];
    }
    if (!fits) {
      // A wrong shape would otherwise run (a 9x9 image in an 8x8 program's larger batch
      // buffer) and give numbers for an input the model was never exported for.
      std::string want = "(";
      for (size_t d = 0; d < e.sizes.size(); ++d) {
        const bool exact = !e.fixed.empty() && e.fixed[d];
        want += (d ? ", " : "") + std::string(exact ? "" : "<=") + std::to_string(e.sizes[d]);
      }
      want += e.sizes.size() == 1 ? ",)" : ")";
      throw std::runtime_error(file + " has shape " + Shape(a.shape) + "; the program's input " +
                               std::to_string(k) + " takes " + want +
                               (e.fixed.empty() ? " (its fixed sizes exactly; the .pte does not "
                                                  "say which they are)"
                                                : ""));
    }
    std::vector<executorch::aten::SizesType> sizes(a.shape.begin(), a.shape.end());
    if (Contiguous(e.dim_order)) {
      c.tensors.push_back(executorch::extension::from_blob(a.data.data(), sizes, type));
      continue;
    }
    // The program reads this input in another dim order (channels_last): lay it out so.
    const auto strides = StridesOf(a.shape, e.dim_order);
    std::vector<uint8_t> laid(a.data.size());
    Permute(a.data.data(), laid.data(), a.shape, strides, item, true);
    a.data = std::move(laid);
    std::vector<executorch::aten::DimOrderType> dim_order(e.dim_order.begin(), e.dim_order.end());
    c.tensors.push_back(executorch::extension::for_blob(a.data.data(), sizes, type)
                            .dim_order(std::move(dim_order))
                            .make_tensor_ptr());
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
    const bool bfloat16 = t.scalar_type() == ScalarType::BFloat16;
    a.descr = bfloat16 ? "<f4" : DescrOf(t.scalar_type());
    for (auto size : t.sizes()) a.shape.push_back(size);
    std::vector<uint8_t> dim_order(t.dim_order().begin(), t.dim_order().end());
    const auto* bytes = static_cast<const uint8_t*>(t.const_data_ptr());
    if (Contiguous(dim_order)) {
      a.data.assign(bytes, bytes + t.nbytes());
    } else {
      // .npy is row-major: a channels_last output's bytes, written as they lie, are another
      // tensor's. Read each element through the output's own strides.
      std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
      a.data.resize(t.nbytes());
      Permute(bytes, a.data.data(), a.shape, strides, t.element_size(), false);
    }
    if (bfloat16) a.data = FromBfloat16(a.data);
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
      return Fail(kArgsError, flag + (flag == "--warmup" ? " must be 0 or more" : " must be at least 1") +
                                  " (a whole number), got '" + value + "'");
  }
  if (model.empty() || inputs.empty()) return Fail(kArgsError, "--model and --inputs are required");

  const auto load_start = std::chrono::steady_clock::now();
  // The runtime says only "AccessFailed" of a path that is no file, and logs nothing.
  if (!std::filesystem::is_regular_file(model))
    return Fail(kModelError, model + (std::filesystem::exists(model) ? " is not a file"
                                                                     : " does not exist"));
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
    const auto expected = ExpectedInputs(module);
    for (const auto& [index, dir] : Numbered(inputs, true)) {
      cases.push_back(LoadCase(dir, expected));
    }
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
        throw std::runtime_error("case " + cases[i].name + ": " + e.what());
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
        const fs::path dir = fs::path(outputs) / cases[i].name;
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
