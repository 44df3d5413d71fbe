// Reading and writing tensors in the format of Python's torch.save.
#pragma once

// Only the tensor type: <torch/torch.h> (the whole C++ frontend) costs every file
// that includes this header about ten seconds of compile time.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace client {

using Case = std::vector<at::Tensor>;  // the inputs (or outputs) of one forward call

// Reads INPUTS.pt: a tensor, a list of tensors (one case), a list of lists, or a
// {name: tensor} dict (one case; `names`, when given, gets its keys in order).
// Throws std::runtime_error naming the file and what was found.
std::vector<Case> LoadCases(const std::string& path, std::vector<std::string>* names = nullptr);

// A dict case in the order of `wanted` (forward()'s argument names) when its keys are
// those names in another order; unchanged otherwise (a golden file's keys are the
// manifest's input names, in forward() order, whatever the arguments are called).
Case BindByName(const Case& one, const std::vector<std::string>& keys,
                const std::vector<std::string>& wanted);

// Writes a list of lists of tensors with torch::jit::pickle_save (torch.load reads it).
void SaveCases(const std::string& path, const std::vector<Case>& cases);

}  // namespace client
