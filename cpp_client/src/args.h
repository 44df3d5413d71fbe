// Command-line arguments of run_torchscript.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace client {

struct Args {
  std::string model;    // TorchScript file or AOTInductor .pt2 package
  std::string inputs;   // tensors written by Python's torch.save
  std::string outputs;  // where to write the outputs (torch.load reads them)
  std::string device = "cpu";
  int threads = 0;  // 0: LibTorch's default
  int warmup = 0;
  int repeat = 1;
  // Shared libraries to dlopen, in this order, before the model is loaded: the
  // custom ops a model calls (torchvision::nms) and what their library needs first.
  std::vector<std::string> load_libraries;
};

// Parses argv; on a usage error returns nullopt and fills `error`.
std::optional<Args> ParseArgs(int argc, char** argv, std::string* error);

// The usage text: on stdout for --help, on stderr with an error.
std::string Usage(const char* program);

}  // namespace client
