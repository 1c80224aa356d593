// The encoder routes' bodies (pooled_api.h).
#include "brisk/serve/pooled_api.h"

#include <algorithm>
#include <bit>

#include "fields.h"

namespace brisk::serve {

using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");

namespace {

void check_id(int64_t id, const std::string& param, int64_t vocab) {
  if (id < 0 || id >= vocab)
    throw ApiError(400, param + ": token " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(vocab) + ")", param);
}

// One input of token ids, each in [0, vocab).
std::vector<int32_t> read_ids(const json& list, const std::string& param, int64_t vocab) {
  std::vector<int32_t> ids;
  for (const json& t : list) {
    if (!t.is_number_integer()) throw ApiError(400, param + " must be a list of token ids", param);
    check_id(t.get<int64_t>(), param, vocab);
    ids.push_back(t.get<int32_t>());
  }
  return ids;
}

}  // namespace

PooledRequest parse_pooled(const std::string& body, const ModelInfo& info, const PooledModel& model,
                           const PooledEncode& encode) {
  const json j = parse_body(body);
  fields::check_model_and_user(j, info);
  PooledRequest r;
  const json* in = fields::field(j, "input");
  if (!in) throw ApiError(400, "input is required: a string, a list of strings or of token ids", "input");
  auto one = [&](const json& v, const std::string& param) {
    std::vector<int32_t> ids;
    if (v.is_string()) {
      ids = encode(v.get<std::string>(), param);
      for (int32_t id : ids) check_id(id, param, model.vocab);  // a tokenizer wider than the model
    } else if (v.is_array()) {
      ids = read_ids(v, param, model.vocab);
    } else {
      throw ApiError(400, param + " must be a string or a list of token ids", param);
    }
    if (ids.empty()) throw ApiError(400, param + " is empty: nothing to read", param);
    if (int64_t(ids.size()) > model.max_len) ids.resize(size_t(model.max_len));
    r.tokens += int64_t(ids.size());
    r.sequences.push_back(std::move(ids));
  };
  // A list is one input of ids when it holds numbers, else a list of inputs.
  const bool many = in->is_array() && !in->empty() && !(*in)[0].is_number();
  if (!many) {
    one(*in, "input");
  } else {
    if (in->size() > size_t(kMaxPooledInputs))
      throw ApiError(400, "input holds " + std::to_string(in->size()) + " inputs; a request takes at most " +
                              std::to_string(kMaxPooledInputs), "input");
    for (size_t i = 0; i < in->size(); ++i) one((*in)[i], "input[" + std::to_string(i) + "]");
  }
  if (model.kind == PooledModel::Kind::embedder) {
    if (const json* f = fields::field(j, "encoding_format")) {
      if (!f->is_string() || (*f != "float" && *f != "base64"))
        throw ApiError(400, "encoding_format must be \"float\" or \"base64\"", "encoding_format");
      r.base64 = *f == "base64";
    }
    if (const json* d = fields::field(j, "dimensions")) {
      if (!d->is_number_integer() || d->get<int64_t>() != model.width)
        throw ApiError(400, "dimensions: this model's embeddings have " + std::to_string(model.width) +
                                " dimensions, and only that many", "dimensions");
    }
  }
  return r;
}

json classify_response(const PooledRequest& r, const std::vector<std::vector<float>>& probs,
                       const PooledModel& model, const std::string& id, int64_t created, const std::string& name) {
  json data = json::array();
  for (size_t i = 0; i < probs.size(); ++i) {
    const std::vector<float>& p = probs[i];
    const size_t k = size_t(std::max_element(p.begin(), p.end()) - p.begin());
    data.push_back({{"index", i},
                    {"label", model.labels[k]},
                    {"probs", p},
                    {"num_classes", p.size()},
                    {"object", "classification"}});
  }
  return {{"id", id},
          {"object", "list"},
          {"created", created},
          {"model", name},
          {"data", std::move(data)},
          {"usage", {{"prompt_tokens", r.tokens}, {"total_tokens", r.tokens}, {"completion_tokens", 0}}}};
}

json embeddings_response(const PooledRequest& r, const std::vector<std::vector<float>>& vectors,
                         const std::string& name) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json e = {{"object", "embedding"}, {"index", i}};
    if (r.base64) e["embedding"] = base64(vectors[i].data(), vectors[i].size() * sizeof(float));
    else e["embedding"] = vectors[i];
    data.push_back(std::move(e));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", name},
          {"usage", {{"prompt_tokens", r.tokens}, {"total_tokens", r.tokens}}}};
}

std::string base64(const void* data, size_t n) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* b = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t v = uint32_t(b[i]) << 16 | (i + 1 < n ? uint32_t(b[i + 1]) << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
    out += kAlphabet[v >> 18 & 63];
    out += kAlphabet[v >> 12 & 63];
    out += i + 1 < n ? kAlphabet[v >> 6 & 63] : '=';
    out += i + 2 < n ? kAlphabet[v & 63] : '=';
  }
  return out;
}

}  // namespace brisk::serve
