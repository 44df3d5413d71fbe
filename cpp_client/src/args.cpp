#include "args.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <sstream>
#include <string_view>

namespace client {

namespace {

constexpr std::string_view kFlags[] = {"--model",   "--inputs",       "--outputs", "--device",
                                       "--threads", "--load-library", "--warmup",  "--repeat"};

bool ParseInt(std::string_view text, int min_value, int* out) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || value < min_value) return false;
  *out = value;
  return true;
}

}  // namespace

std::string Usage(const char* program) {
  std::ostringstream out;
  out << "usage: " << program
      << " --model MODEL.pt|MODEL.pt2 --inputs INPUTS.pt [--outputs OUTPUTS.pt]\n"
         "       [--device cpu|cuda[:N]] [--threads N] [--warmup N] [--repeat N]\n"
         "       [--load-library LIB.so]...\n\n"
         "Runs a TorchScript model, or an AOTInductor package (a .pt2 file from\n"
         "torch._inductor.aoti_compile_and_package or `pipeline export --format pt2`,\n"
         "run on the device type it was compiled for), on tensors saved by Python's torch.save.\n"
         "INPUTS.pt holds one case (a tensor, a list of tensors in forward() order, a\n"
         "{name: tensor} dict or a golden.pt from `pipeline export`) or several (a list of\n"
         "lists). OUTPUTS.pt gets a tuple of cases, each a tuple of\n"
         "output tensors (tuples are flattened), readable with torch.load.\n"
         "Latency statistics over --repeat runs (after --warmup) go to stdout as JSON.\n"
         "--load-library (repeatable) dlopens a shared library (RTLD_NOW|RTLD_GLOBAL), in the\n"
         "order given, before the model is loaded: the library of custom ops the model calls.\n"
         "torchvision's ops (torchvision::nms) need three, in this order: libpython3.X.so,\n"
         "torch/lib/libtorch_python.so, torchvision/_C_stable.so; `pipeline verify --backend cpp`\n"
         "passes them itself when the manifest records op_libraries.\n";
  return out.str();
}

std::optional<Args> ParseArgs(int argc, char** argv, std::string* error) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      *error = "";
      return std::nullopt;
    }
    // An unknown flag is named as such, wherever it stands (last, it was "missing value").
    if (std::find(std::begin(kFlags), std::end(kFlags), flag) == std::end(kFlags)) {
      *error = "unknown argument " + std::string(flag) + " (see --help)";
      return std::nullopt;
    }
    if (i + 1 >= argc) {
      *error = "missing value after " + std::string(flag);
      return std::nullopt;
    }
    std::string_view value = argv[++i];
    if (flag == "--model") {
      args.model = value;
    } else if (flag == "--inputs") {
      args.inputs = value;
    } else if (flag == "--outputs") {
      args.outputs = value;
    } else if (flag == "--device") {
      args.device = value;
    } else if (flag == "--threads") {
      if (!ParseInt(value, /*min_value=*/1, &args.threads)) {
        *error = "--threads must be a positive integer, got '" + std::string(value) + "'";
        return std::nullopt;
      }
    } else if (flag == "--load-library") {
      if (value.empty()) {
        *error = "--load-library needs a path to a shared library";
        return std::nullopt;
      }
      args.load_libraries.emplace_back(value);
    } else if (flag == "--warmup") {
      if (!ParseInt(value, /*min_value=*/0, &args.warmup)) {
        *error = "--warmup must be 0 or more (a whole number), got '" + std::string(value) + "'";
        return std::nullopt;
      }
    } else if (flag == "--repeat") {
      if (!ParseInt(value, /*min_value=*/1, &args.repeat)) {
        *error = "--repeat must be at least 1 (a whole number), got '" + std::string(value) + "'";
        return std::nullopt;
      }
    }
  }
  if (args.model.empty() || args.inputs.empty()) {
    *error = "--model and --inputs are required";
    return std::nullopt;
  }
  return args;
}

}  // namespace client
