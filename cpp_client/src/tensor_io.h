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

// A dict case in the order of the first of `namings` (forward()'s argument names, then
// golden.pt's, the manifest's names in forward() order) that holds all its keys (some may
// be left out: forward()'s defaulted arguments). Keys
// none of them holds are taken in the file's order (a golden file of another export);
// keys some of which are known names and others not throw std::runtime_error naming both
// (they were taken in the file's order: inputs swapped, exit 0).
Case BindByName(const Case& one, const std::vector<std::string>& keys,
                const std::vector<std::vector<std::string>>& namings);

// The input names of the golden.pt in `model`'s folder (an export folder), in forward()
// order; empty when there is none or it cannot be read.
std::vector<std::string> GoldenNames(const std::string& model);

// Writes a list of lists of tensors with torch::jit::pickle_save (torch.load reads it).
void SaveCases(const std::string& path, const std::vector<Case>& cases);

}  // namespace client
