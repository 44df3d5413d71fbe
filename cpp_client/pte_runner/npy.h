// Minimal .npy (NumPy format 1.0/2.0) reading and writing: little-endian, C order, the
// dtypes a model's inputs and outputs take. The runner has no LibTorch to read
// torch.save files, and .npy is what numpy, verify and a device's own tooling all write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace npy {

struct Array {
  std::string descr;            // numpy's dtype string: "<f4", "<i8", "|b1"
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;    // row-major bytes
};

// Throws std::runtime_error naming the file and what is wrong with it.
Array Read(const std::string& path);
void Write(const std::string& path, const Array& array);
// Bytes per element of a descr, or 0 when the runner does not take it.
size_t ItemSize(const std::string& descr);

}  // namespace npy
