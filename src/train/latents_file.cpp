// Latents files (latents_file.h).
#include "brisk/train/latents_file.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"

namespace brisk::train {

using core::IoError;

void write_latents_file(const std::string& path, const LatentsFile& f) {
  const int64_t N = f.size();
  if (N == 0) throw IoError(path + ": no sequences to write");
  using core::DType;
  using core::Shape;
  core::TensorMeta lat{Shape{N, f.latent}, DType::f32}, len{Shape{N}, DType::i32};
  const std::vector<core::NamedTensor> tensors = {
      {"latents", {const_cast<float*>(f.latents.data()), lat}},
      {"lengths", {const_cast<int32_t*>(f.lengths.data()), len}},
      {"full_lengths", {const_cast<int32_t*>(f.full_lengths.data()), len}}};
  core::save_safetensors(path, tensors,
                         {{"format", "brisk-latents"},
                          // FASTA headers are bytes; JSON text is UTF-8.
                          {"names", nlohmann::json(f.names).dump(-1, ' ', false,
                                                                 nlohmann::json::error_handler_t::replace)},
                          {"checkpoint", f.checkpoint},
                          {"model_xxh64", f.model_xxh64},
                          {"latent", std::to_string(f.latent)},
                          {"max_len", std::to_string(f.max_len)}});
}

LatentsFile read_latents_file(const std::string& path) {
  const core::SafetensorsFile st = core::load_safetensors(path);
  auto tensor = [&](const std::string& name, core::DType dtype, int rank) -> const core::Tensor& {
    auto it = st.tensors.find(name);
    if (it == st.tensors.end())
      throw IoError(path + ": no tensor '" + name + "': not a latents file from brisk encode?");
    if (it->second.dtype() != dtype || it->second.shape().rank() != rank)
      throw IoError(path + ": tensor '" + name + "' is " + it->second.meta().str() + ", expected rank " +
                    std::to_string(rank) + " " + std::string(core::dtype_name(dtype)));
    return it->second;
  };
  const core::Tensor& lat = tensor("latents", core::DType::f32, 2);
  const core::Tensor& len = tensor("lengths", core::DType::i32, 1);
  LatentsFile f;
  const int64_t N = lat.shape()[0];
  f.latent = lat.shape()[1];
  if (N == 0 || f.latent == 0) throw IoError(path + ": tensor 'latents' is empty");
  if (len.shape()[0] != N)
    throw IoError(path + ": tensor 'lengths' has " + std::to_string(len.shape()[0]) + " entries for " +
                  std::to_string(N) + " latents");
  f.latents.assign(lat.data_as<float>(), lat.data_as<float>() + N * f.latent);
  for (size_t i = 0; i < f.latents.size(); ++i)
    if (!std::isfinite(f.latents[i]))
      throw IoError(path + ": latent " + std::to_string(int64_t(i) / f.latent) + " holds a non-finite number");
  f.lengths.assign(len.data_as<int32_t>(), len.data_as<int32_t>() + N);
  for (int64_t i = 0; i < N; ++i)
    if (f.lengths[size_t(i)] < 1)
      throw IoError(path + ": lengths[" + std::to_string(i) + "] is " + std::to_string(f.lengths[size_t(i)]) +
                    "; every sequence has at least one residue");
  if (st.tensors.count("full_lengths")) {
    const core::Tensor& full = tensor("full_lengths", core::DType::i32, 1);
    if (full.shape()[0] != N)
      throw IoError(path + ": tensor 'full_lengths' has " + std::to_string(full.shape()[0]) + " entries for " +
                    std::to_string(N) + " latents");
    f.full_lengths.assign(full.data_as<int32_t>(), full.data_as<int32_t>() + N);
    for (int64_t i = 0; i < N; ++i)
      if (f.full_lengths[size_t(i)] < f.lengths[size_t(i)])
        throw IoError(path + ": full_lengths[" + std::to_string(i) + "] is " +
                      std::to_string(f.full_lengths[size_t(i)]) + ", below lengths[" + std::to_string(i) + "] (" +
                      std::to_string(f.lengths[size_t(i)]) + "): a sequence is at least as long as its encoded part");
  } else {
    f.full_lengths = f.lengths;
  }
  auto meta = [&](const std::string& key) {
    auto it = st.metadata.find(key);
    return it == st.metadata.end() ? std::string() : it->second;
  };
  // The metadata is optional (a file from another tool may have none), but
  // what there is must agree with the tensors.
  if (const std::string format = meta("format"); !format.empty() && format != "brisk-latents")
    throw IoError(path + ": metadata 'format' is '" + format + "', not 'brisk-latents'");
  if (const std::string width = meta("latent"); !width.empty() && width != std::to_string(f.latent))
    throw IoError(path + ": metadata 'latent' says " + width + " but tensor 'latents' is " +
                  std::to_string(f.latent) + " wide");
  f.checkpoint = meta("checkpoint");
  f.model_xxh64 = meta("model_xxh64");
  if (const std::string m = meta("max_len"); !m.empty()) f.max_len = std::atoll(m.c_str());
  // Names are a convenience: without them (a file from another tool) rows are numbered.
  if (const std::string names = meta("names"); !names.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(names);
    } catch (const nlohmann::json::exception&) {
      throw IoError(path + ": metadata 'names' is not a JSON array of strings");
    }
    if (!j.is_array() || int64_t(j.size()) != N)
      throw IoError(path + ": metadata 'names' must be a JSON array of " + std::to_string(N) + " strings");
    for (const auto& n : j) {
      if (!n.is_string()) throw IoError(path + ": metadata 'names' must hold strings");
      f.names.push_back(n.get<std::string>());
      if (f.names.back().find_first_of("\r\n") != std::string::npos)
        throw IoError(path + ": metadata 'names' entry " + std::to_string(f.names.size() - 1) +
                      " holds a line break (a FASTA header is one line)");
    }
  } else {
    for (int64_t i = 0; i < N; ++i) f.names.push_back("seq" + std::to_string(i));
  }
  return f;
}

}  // namespace brisk::train
