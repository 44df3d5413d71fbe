#include "inference.h"
#include "tensor_io.h"

// torch::jit::load and torch::jit::Module without the rest of <torch/script.h>
// (all of ATen's operators, custom ops and classes): the narrow headers build faster.
#include <ATen/core/ivalue.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <dlfcn.h>
#include <fstream>
#include <numeric>

namespace client {

namespace {

// Where aoti_compile_and_package puts the compiled model (the loader's default model_name).
constexpr char kPt2ModelName[] = "model";
constexpr char kPt2ModelDir[] = "data/aotinductor/model/";
constexpr char kPt2Extension[] = ".pt2";

void Flatten(const c10::IValue& value, Case* out) {
  if (value.isTensor()) {
    out->push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& item : value.toTupleRef().elements()) Flatten(item, out);
  } else if (value.isList()) {
    for (const auto& item : value.toListRef()) Flatten(item, out);
  } else if (value.isGenericDict()) {
    // A model returning {"logits": ..., "embedding": ...}: c10::Dict keeps insertion
    // order, the order the manifest lists the outputs' names in.
    for (const auto& item : value.toGenericDict()) Flatten(item.value(), out);
  } else {
    throw std::runtime_error(std::string("unsupported model output type ") + value.tagKind());
  }
}

std::string MessageOf(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The last non-empty line of an interpreter error: the cause, without the
// TorchScript traceback that precedes it.
std::string LastLine(const std::exception& e) {
  const std::string text = MessageOf(e);
  const auto pos = text.rfind('\n');
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

// The first line of an AOTInductor error: the cause; the lines after it are
// generic advice ("This error most often comes from an incorrect fake kernel").
std::string FirstLine(const std::exception& e) {
  const std::string text = MessageOf(e);
  return text.substr(0, text.find('\n'));
}

// Record names of a zip archive written by torch (its top folder stripped), or
// nothing when PATH is not such an archive.
std::vector<std::string> ZipRecords(const std::string& path, std::string* error) {
  try {
    return caffe2::serialize::PyTorchStreamReader(path).getAllRecords();
  } catch (const c10::Error& e) {
    // The first sentence: "failed reading zip archive: failed finding central directory".
    const std::string text = FirstLine(e);
    if (error) *error = text.substr(0, text.find(". "));
    return {};
  }
}

bool HasPt2Model(const std::vector<std::string>& records) {
  return std::any_of(records.begin(), records.end(),
                     [](const std::string& name) { return name.rfind(kPt2ModelDir, 0) == 0; });
}

class TorchScriptRunner final : public Runner {
 public:
  TorchScriptRunner(const std::string& path, const c10::Device& device) {
    try {
      module_ = torch::jit::load(path, device);
      module_.eval();
    } catch (const std::exception& e) {  // c10::Error, or torch::jit::ErrorReport
      std::string cause = MessageOf(e);
      cause.erase(0, cause.find_first_not_of("\n "));  // an ErrorReport starts with a newline
      if (cause.rfind("Unknown builtin op", 0) == 0) {
        // A custom operator (torchvision::nms) whose library was not loaded first: its
        // first line names it; the TorchScript source excerpt after it adds nothing.
        cause = cause.substr(0, cause.find('\n')) +
                " The model calls a custom operator: load the library that registers it "
                "first with --load-library (torchvision's ops need libpython3.X.so, "
                "torch/lib/libtorch_python.so and torchvision/_C_stable.so, in that order).";
      }
      throw std::runtime_error("cannot load TorchScript model " + path + ": " + cause);
    }
  }

  Case Run(const Case& inputs) override {
    Case outputs;
    Flatten(module_.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())), &outputs);
    return outputs;
  }

  std::vector<std::string> InputNames() const override {
    std::vector<std::string> names;
    const auto& arguments = module_.get_method("forward").function().getSchema().arguments();
    for (size_t i = 1; i < arguments.size(); ++i) names.push_back(arguments[i].name());  // not self
    return names;
  }

 private:
  torch::jit::Module module_;
};

class Pt2Runner final : public Runner {
 public:
  Pt2Runner(const std::string& path, const c10::Device& device) {
    const std::string what = "cannot load AOTInductor package " + path + ": ";
    if (!std::ifstream(path)) throw std::runtime_error(what + "no such file, or it cannot be read");
    std::string error;
    const std::vector<std::string> records = ZipRecords(path, &error);
    if (!error.empty()) {
      throw std::runtime_error(what + "not a readable .pt2 archive (" + error + ")");
    }
    if (!HasPt2Model(records)) {
      throw std::runtime_error(
          what + "the archive holds no compiled model (" + kPt2ModelDir +
          "); torch.export.save writes such files. Compile one with "
          "torch._inductor.aoti_compile_and_package or `pipeline export --format pt2`");
    }
    // The package runs only on the device type it was compiled for; say so
    // before the loader tries to create, say, a CUDA runner on a CPU-only machine.
    std::string compiled_for;
    try {
      compiled_for =
          torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, kPt2ModelName)
              .at("AOTI_DEVICE_KEY");
    } catch (const std::exception& e) {
      throw std::runtime_error(what + "cannot read its metadata: " + FirstLine(e));
    }
    if (compiled_for != c10::DeviceTypeName(device.type(), /*lower_case=*/true)) {
      throw DeviceMismatchError(path + " was compiled for " + compiled_for +
                                " and cannot run on --device " + device.str() +
                                "; run it with --device " + compiled_for +
                                " or compile the package for " + device.str());
    }
    // The generated code checks dtypes, sizes and strides of its inputs only when
    // this is set; without it a wrong shape runs the kernels out of bounds
    // (torch/_inductor/codegen/cpp_wrapper_cpu.py, _check_aoti_runtime_check_inputs_env).
    // It is read once, on the first run. A user's own setting (=0) wins.
    setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/0);
    try {
      loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          path, kPt2ModelName, /*run_single_threaded=*/false, /*num_runners=*/1,
          /*device_index=*/device.has_index() ? device.index() : -1);
    } catch (const std::exception& e) {
      throw std::runtime_error(what + FirstLine(e));
    }
  }


  Case Run(const Case& inputs) override {
    // Compiled kernels assume the contiguous strides they were traced with;
    // torch.save keeps a transposed tensor's strides.
    std::vector<at::Tensor> contiguous;
    contiguous.reserve(inputs.size());
    for (const auto& t : inputs) contiguous.push_back(t.contiguous());
    try {
      return loader_->run(contiguous);
    } catch (const std::exception& e) {
      std::string cause = FirstLine(e);
      if (cause.find("dim value is too small") != std::string::npos) {
        cause +=
            " (AOTInductor's input check rejects a dynamic size below 2 unless the package was "
            "compiled with inductor_configs={\"aot_inductor.check_lowerbound\": False}; "
            "AOTI_RUNTIME_CHECK_INPUTS=0 turns all input checks off)";
      }
      throw std::runtime_error(cause);
    }
  }

 private:
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
};

double Percentile(std::vector<double> sorted, double q) {
  // Nearest-rank on sorted samples: the smallest value with at least q of the runs at or below it.
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

void Synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace

void LoadLibrary(const std::string& path) {
  dlerror();  // clear any earlier error
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("cannot load library " + path + " (--load-library): " +
                             (why ? why : "unknown dlopen error"));
  }
  // Never dlclose'd: the operators it registered must outlive the model.
}

const char* FormatName(ModelFormat format) {
  return format == ModelFormat::kPt2 ? "pt2" : "torchscript";
}

ModelFormat DetectFormat(const std::string& path) {
  const std::string_view ext = kPt2Extension;
  if (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
    return ModelFormat::kPt2;
  }
  return HasPt2Model(ZipRecords(path, /*error=*/nullptr)) ? ModelFormat::kPt2
                                                          : ModelFormat::kTorchScript;
}

std::unique_ptr<Runner> LoadModel(const std::string& path, ModelFormat format,
                                  const c10::Device& device) {
  if (format == ModelFormat::kPt2) return std::make_unique<Pt2Runner>(path, device);
  return std::make_unique<TorchScriptRunner>(path, device);
}

Case RunCase(Runner& runner, const Case& inputs, const c10::Device& device) {
  Case on_device;
  on_device.reserve(inputs.size());
  for (const auto& t : inputs) on_device.push_back(t.to(device));
  c10::InferenceMode guard;
  try {
    return runner.Run(on_device);
  } catch (const std::exception& e) {  // c10::Error, or a JIT exception from the interpreter
    std::string shapes;
    for (const auto& t : inputs) {
      shapes += (shapes.empty() ? "" : ", ") + c10::str(t.sizes()) + " " +
                std::string(c10::toString(t.scalar_type()));
    }
    throw std::runtime_error("the model rejected inputs [" + shapes + "]: " + LastLine(e));
  }
}

LatencyStats Time(Runner& runner, const Case& inputs, const c10::Device& device, int warmup,
                  int repeat) {
  for (int i = 0; i < warmup; ++i) RunCase(runner, inputs, device);
  Synchronize(device);
  std::vector<double> ms;
  ms.reserve(repeat);
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    RunCase(runner, inputs, device);
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
