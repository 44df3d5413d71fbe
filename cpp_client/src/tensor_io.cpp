#include "tensor_io.h"

// torch::jit::pickle_load and pickle_save (what the C++ frontend's torch::pickle_load
// and torch::pickle_save forward to), without <torch/serialize.h> and the frontend's
// archives: the narrow header builds faster.
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace client {

namespace {

std::vector<char> ReadFile(const std::string& path) {
  // An ifstream opens a directory and fails at the first read ("basic_filebuf::underflow").
  if (std::filesystem::is_directory(path))
    throw std::runtime_error("inputs file " + path + " is a directory, not a torch.save file");
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open inputs file " + path);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

// The elements of a list or tuple IValue.
std::vector<c10::IValue> Items(const c10::IValue& value) {
  if (value.isList()) return value.toListRef().vec();
  return value.toTupleRef().elements().vec();
}

bool IsSequence(const c10::IValue& value) { return value.isList() || value.isTuple(); }

Case TensorsOf(const c10::IValue& value, const std::string& path) {
  Case tensors;
  for (const auto& item : Items(value)) {
    if (!item.isTensor()) {
      throw std::runtime_error(path + ": a case must be a list of tensors, found " +
                               std::string(item.tagKind()));
    }
    tensors.push_back(item.toTensor());
  }
  return tensors;
}

}  // namespace

std::vector<Case> LoadCases(const std::string& path, std::vector<std::string>* names) {
  const std::vector<char> data = ReadFile(path);
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(data);
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot read inputs file " + path +
                             " (expected tensors saved with torch.save): " + e.what_without_backtrace());
  }
  if (value.isGenericDict()) {
    // A golden file from `pipeline export`: {"inputs": {name: tensor}, "outputs": ...},
    // or a plain {name: tensor} dict; insertion order is forward() order.
    auto dict = value.toGenericDict();
    if (dict.contains("inputs")) dict = dict.at("inputs").toGenericDict();
    Case one;
    for (const auto& entry : dict) {
      if (!entry.value().isTensor()) throw std::runtime_error(path + ": dict values must be tensors");
      if (!entry.key().isString()) throw std::runtime_error(path + ": dict keys must be names");
      one.push_back(entry.value().toTensor());
      if (names != nullptr) names->push_back(entry.key().toStringRef());
    }
    return {one};
  }
  if (value.isTensor()) return {Case{value.toTensor()}};
  if (!IsSequence(value)) {
    throw std::runtime_error(path + ": expected a tensor or a list, found " +
                             std::string(value.tagKind()));
  }
  const std::vector<c10::IValue> items = Items(value);
  if (items.empty()) throw std::runtime_error(path + ": the list of inputs is empty");
  if (!IsSequence(items.front())) return {TensorsOf(value, path)};  // one case
  std::vector<Case> cases;
  for (const auto& item : items) {
    if (!IsSequence(item)) throw std::runtime_error(path + ": each case must be a list of tensors");
    cases.push_back(TensorsOf(item, path));
  }
  return cases;
}

Case BindByName(const Case& one, const std::vector<std::string>& keys,
                const std::vector<std::vector<std::string>>& namings) {
  const auto holds = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  for (const auto& wanted : namings) {
    if (wanted.empty() || keys.size() != one.size()) continue;
    if (!std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return holds(wanted, k); }))
      continue;
    Case bound;  // in forward()'s order; an argument left out keeps its default
    for (const auto& name : wanted) {
      const auto at = std::find(keys.begin(), keys.end(), name);
      if (at != keys.end()) bound.push_back(one[static_cast<size_t>(at - keys.begin())]);
    }
    return bound;
  }
  const auto known = [&](const std::string& key) {
    return std::any_of(namings.begin(), namings.end(),
                       [&](const auto& names) { return holds(names, key); });
  };
  if (std::none_of(keys.begin(), keys.end(), known)) return one;  // the file's order, as written
  const auto list = [](const std::vector<std::string>& names) {
    std::string out = "[";
    for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
    return out + "]";
  };
  std::string expected;
  for (const auto& names : namings)
    if (!names.empty() && expected.find(list(names)) == std::string::npos)
      expected += (expected.empty() ? "" : " or ") + list(names);
  throw std::runtime_error("the inputs are named " + list(keys) + ", not as the model's " +
                           expected + ": name each input as forward() does, or save a list " +
                           "to give them in forward()'s order");
}

std::vector<std::string> GoldenNames(const std::string& model) {
  const auto slash = model.find_last_of('/');
  const std::string golden =
      (slash == std::string::npos ? std::string() : model.substr(0, slash + 1)) + "golden.pt";
  if (!std::ifstream(golden)) return {};
  std::vector<std::string> names;
  try {
    LoadCases(golden, &names);
  } catch (const std::exception&) {
    return {};
  }
  return names;
}

void SaveCases(const std::string& path, const std::vector<Case>& cases) {
  // Tuples, not typed lists: a typed list is pickled with a type tag
  // (torch.jit._pickle.restore_type_tag) that torch.load(weights_only=True) refuses.
  std::vector<c10::IValue> outer;
  for (const auto& one : cases) {
    std::vector<c10::IValue> inner;
    for (const auto& t : one) inner.emplace_back(t.detach().to(c10::kCPU).contiguous());
    outer.emplace_back(c10::ivalue::Tuple::create(std::move(inner)));
  }
  const c10::IValue value(c10::ivalue::Tuple::create(std::move(outer)));
  const std::vector<char> data = torch::jit::pickle_save(value);
  std::ofstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot write outputs file " + path);
  file.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!file) throw std::runtime_error("failed writing outputs file " + path);
}

}  // namespace client
