#include "npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace npy {

namespace {
const char kMagic[] = "\x93NUMPY";

std::runtime_error Bad(const std::string& path, const std::string& why) {
  return std::runtime_error(path + ": " + why);
}
}  // namespace

size_t ItemSize(const std::string& descr) {
  static const std::pair<const char*, size_t> kKnown[] = {
      {"<f4", 4}, {"<f8", 8}, {"<f2", 2}, {"<i8", 8}, {"<i4", 4}, {"<i2", 2},
      {"|i1", 1}, {"|u1", 1}, {"|b1", 1}};
  for (const auto& [name, size] : kKnown) {
    if (descr == name) return size;
  }
  return 0;
}

Array Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Bad(path, "cannot open");
  char magic[6];
  unsigned char version[2];
  in.read(magic, 6);
  in.read(reinterpret_cast<char*>(version), 2);
  if (!in || std::memcmp(magic, kMagic, 6) != 0) throw Bad(path, "not a .npy file");
  uint32_t header_len = 0;
  if (version[0] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else if (version[0] == 2 || version[0] == 3) {
    unsigned char b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    throw Bad(path, "unknown .npy version " + std::to_string(version[0]));
  }
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  if (!in) throw Bad(path, "truncated header");
  std::smatch m;
  Array array;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'"))) {
    throw Bad(path, "no descr in header");
  }
  array.descr = m[1];
  if (ItemSize(array.descr) == 0) {
    throw Bad(path, "dtype " + array.descr + " is not one the runner takes");
  }
  if (std::regex_search(header, m, std::regex("'fortran_order':\\s*True"))) {
    throw Bad(path, "Fortran order; save it C-contiguous (np.ascontiguousarray)");
  }
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) {
    throw Bad(path, "no shape in header");
  }
  std::stringstream dims(m[1].str());
  std::string dim;
  size_t count = 1;
  while (std::getline(dims, dim, ',')) {
    if (dim.find_first_not_of(" ") == std::string::npos) continue;
    array.shape.push_back(std::stoll(dim));
    count *= static_cast<size_t>(array.shape.back());
  }
  array.data.resize(count * ItemSize(array.descr));
  in.read(reinterpret_cast<char*>(array.data.data()), static_cast<std::streamsize>(array.data.size()));
  if (!in) throw Bad(path, "truncated data");
  return array;
}

void Write(const std::string& path, const Array& array) {
  std::string shape = "(";
  for (size_t i = 0; i < array.shape.size(); ++i) {
    shape += std::to_string(array.shape[i]) + (array.shape.size() == 1 ? "," : "");
    if (i + 1 < array.shape.size()) shape += ", ";
  }
  shape += ")";
  std::string header =
      "{'descr': '" + array.descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // The data starts on a 64-byte boundary (numpy's rule); the header ends with '\n'.
  const size_t preamble = 10;
  header.append(64 - (preamble + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Bad(path, "cannot write");
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(array.data.data()),
            static_cast<std::streamsize>(array.data.size()));
  if (!out) throw Bad(path, "write failed");
}

}  // namespace npy
