// `brisk export gguf` (gguf_export.h): a checkpoint as a GGUF v3 file for
// llama.cpp's `gpt2` architecture.
//
// The file: "GGUF", version 3, the tensor and key counts, the metadata
// (key, type, value), one info per tensor (name, dims innermost first, ggml
// type, offset in the data section), padding to general.alignment (32), then
// every tensor's bytes at its offset. All little-endian.
//
// llama.cpp's gpt2 graph is brisk's GPT: pre-LayerNorm blocks (eps from
// gpt2.attention.layer_norm_epsilon), a fused qkv projection with bias, tanh
// GELU, learned positions, a final LayerNorm, and an LM head that falls back
// to token_embd when the file has no output.weight, which is how the tie is
// kept. ggml's dims list the contiguous axis first, so a Linear weight brisk
// holds (out, in) row-major is dims {in, out}, stored as it is.
#include "brisk/export/gguf_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#include "brisk/core/atomic_file.h"
#include "brisk/core/dtype.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/tokenizer.h"
#include "brisk/export/ggml_quants.h"
#include "brisk/train/checkpoint.h"

namespace brisk::exporter {

namespace {

constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kAlignment = 32;
constexpr float kLayerNormEps = 1e-5f;  // models::Gpt's LayerNorms

// GGUF metadata value types (gguf.h).
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kString = 8, kArray = 9 };
// llama.cpp's token types and file types.
enum : int32_t { kTokenNormal = 1, kTokenControl = 3 };
uint32_t file_type(GgufType t) {
  switch (t) {
    case GgufType::f32: return 0;      // LLAMA_FTYPE_ALL_F32
    case GgufType::f16: return 1;      // MOSTLY_F16
    case GgufType::q4_0: return 2;     // MOSTLY_Q4_0
    case GgufType::q8_0: return 7;     // MOSTLY_Q8_0
    case GgufType::q4_k_s: return 14;  // MOSTLY_Q4_K_S
    case GgufType::q4_k_m: return 15;  // MOSTLY_Q4_K_M
    case GgufType::q5_k_s: return 16;  // MOSTLY_Q5_K_S
    case GgufType::q5_k_m: return 17;  // MOSTLY_Q5_K_M
    case GgufType::q6_k: return 18;    // MOSTLY_Q6_K
  }
  return 0;
}

// Little-endian bytes, appended.
class Bytes {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = b_.size();
    b_.resize(at + sizeof v);
    std::memcpy(b_.data() + at, &v, sizeof v);
  }
  void str(const std::string& s) {
    put(uint64_t(s.size()));
    b_.insert(b_.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t align) { b_.resize((b_.size() + align - 1) / align * align, 0); }
  void raw(const void* p, size_t n) { b_.insert(b_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n); }
  const std::vector<char>& data() const { return b_; }
  size_t size() const { return b_.size(); }

 private:
  std::vector<char> b_;
};

// The metadata section, counting its keys.
class Metadata {
 public:
  void u32(const std::string& key, uint32_t v) { head(key, kU32).put(v); }
  void f32(const std::string& key, float v) { head(key, kF32).put(v); }
  void str(const std::string& key, const std::string& v) { head(key, kString).str(v); }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    head(key, kArray).put(kString);
    b_.put(uint64_t(v.size()));
    for (const std::string& s : v) b_.str(s);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    head(key, kArray).put(kI32);
    b_.put(uint64_t(v.size()));
    for (int32_t x : v) b_.put(x);
  }
  uint64_t count() const { return count_; }
  const Bytes& bytes() const { return b_; }

 private:
  Bytes& head(const std::string& key, uint32_t type) {
    ++count_;
    b_.str(key);
    b_.put(type);
    return b_;
  }
  Bytes b_;
  uint64_t count_ = 0;
};

// The ggml type of one weight in a file of type `file`. The K-quant mixes
// are llama-quantize's for gpt2 without an importance matrix (llama.cpp's
// llama_tensor_get_type, where a fused qkv follows attn_v's rules): the
// token embedding, which is also the LM head, in Q6_K; for _M, attn_qkv and
// ffn_down in Q6_K in the first and last eighth of the blocks and every
// third block between (use_more_bits); for q4_k_s, attn_qkv in Q5_K in the
// first 4 blocks and ffn_down in the first eighth. Every other weight is
// the mix's base type.
enum class Role { token_embd, attn_qkv, attn_output, ffn_up, ffn_down };

ggml::Type weight_type(GgufType file, Role role, int64_t layer, int64_t n_layer) {
  const bool more_bits = layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
  switch (file) {
    case GgufType::f32: return ggml::Type::f32;
    case GgufType::f16: return ggml::Type::f16;
    case GgufType::q8_0: return ggml::Type::q8_0;
    case GgufType::q4_0: return ggml::Type::q4_0;
    case GgufType::q6_k: return ggml::Type::q6_K;
    case GgufType::q4_k_s:
      if (role == Role::token_embd) return ggml::Type::q6_K;
      if ((role == Role::attn_qkv && layer < 4) || (role == Role::ffn_down && layer < n_layer / 8))
        return ggml::Type::q5_K;
      return ggml::Type::q4_K;
    case GgufType::q4_k_m:
    case GgufType::q5_k_m: {
      const bool up = role == Role::token_embd || ((role == Role::attn_qkv || role == Role::ffn_down) && more_bits);
      return up ? ggml::Type::q6_K : file == GgufType::q4_k_m ? ggml::Type::q4_K : ggml::Type::q5_K;
    }
    case GgufType::q5_k_s:
      return role == Role::token_embd ? ggml::Type::q6_K : ggml::Type::q5_K;
  }
  return ggml::Type::f32;
}

struct TensorOut {
  std::string name;
  std::vector<uint64_t> dims;  // innermost first
  ggml::Type type;
  std::vector<uint8_t> data;
};

// A parameter as a GGUF tensor in `type` (rows of dims[0] values).
TensorOut tensor(const models::Gpt& model, const std::string& brisk_name, const std::string& gguf_name,
                 ggml::Type type = ggml::Type::f32) {
  const core::ParameterStore& store = model.params();
  const core::Tensor t = store.download(store.at(brisk_name).value);
  TensorOut o;
  o.name = gguf_name;
  for (int d = t.shape().rank() - 1; d >= 0; --d) o.dims.push_back(uint64_t(t.shape()[d]));
  o.type = type;
  o.data.resize(ggml::row_bytes(type, t.numel()));
  try {
    ggml::quantize(type, t.data_as<float>(), t.numel(), o.data.data());
  } catch (const std::range_error& e) {
    throw core::ConfigError("cannot write '" + brisk_name + "' as " + ggml::type_name(type) + ": " + e.what() +
                            " (a diverged model? --type f32 holds any finite value)");
  }
  return o;
}

// The tokenizer as llama.cpp's "gpt2" BPE vocabulary: every id's text in the
// byte-level alphabet (a bytes model: its 256 bytes, no merges), padding ids
// past the tokenizer as control tokens that never appear in text.
void write_vocab(Metadata& md, const std::string& tokenizer_name, const std::string& vocab_dir, int64_t vocab,
                 int64_t& written) {
  const auto tok = data::make_tokenizer(tokenizer_name, vocab_dir);
  if (tok->vocab_size() > vocab)
    throw core::ConfigError("the " + tokenizer_name + " tokenizer has " + std::to_string(tok->vocab_size()) +
                            " tokens, more than the model's vocab_size " + std::to_string(vocab));
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int32_t id = 0; id < int32_t(vocab); ++id) {
    if (id < tok->vocab_size()) {
      tokens.push_back(data::byte_level_text(tok->decode(std::span<const int32_t>(&id, 1))));
      types.push_back(id == tok->eot_token() ? kTokenControl : kTokenNormal);
    } else {
      tokens.push_back("<|brisk_pad_" + std::to_string(id) + "|>");
      types.push_back(kTokenControl);
    }
  }
  std::vector<std::string> merges;
  if (tokenizer_name == "gpt2")
    for (const auto& [a, b] : data::load_gpt2_merges(vocab_dir.empty() ? data::default_gpt2_vocab_dir() : vocab_dir))
      merges.push_back(a + " " + b);
  md.str("tokenizer.ggml.model", "gpt2");
  md.str("tokenizer.ggml.pre", "gpt-2");
  md.strings("tokenizer.ggml.tokens", tokens);
  md.i32s("tokenizer.ggml.token_type", types);
  md.strings("tokenizer.ggml.merges", merges);
  if (tok->eot_token() >= 0) {
    md.u32("tokenizer.ggml.bos_token_id", uint32_t(tok->eot_token()));
    md.u32("tokenizer.ggml.eos_token_id", uint32_t(tok->eot_token()));
  }
  written = int64_t(tokens.size());
}

}  // namespace

namespace {

struct TypeName {
  GgufType type;
  const char* name;
};
constexpr TypeName kTypeNames[] = {{GgufType::f32, "f32"},       {GgufType::f16, "f16"},       {GgufType::q8_0, "q8_0"},
                                   {GgufType::q4_0, "q4_0"},     {GgufType::q6_k, "q6_k"},     {GgufType::q5_k_m, "q5_k_m"},
                                   {GgufType::q5_k_s, "q5_k_s"}, {GgufType::q4_k_m, "q4_k_m"}, {GgufType::q4_k_s, "q4_k_s"}};

bool is_k_quant(GgufType t) {
  return t == GgufType::q4_k_s || t == GgufType::q4_k_m || t == GgufType::q5_k_s || t == GgufType::q5_k_m ||
         t == GgufType::q6_k;
}

}  // namespace

GgufType parse_gguf_type(const std::string& name) {
  std::string lower = name, choices;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));  // llama.cpp writes Q4_K_M
  for (const TypeName& t : kTypeNames) {
    if (lower == t.name) return t.type;
    choices += std::string(choices.empty() ? "" : ", ") + t.name;
  }
  throw core::ConfigError("--type '" + name + "': expected one of " + choices);
}

const char* gguf_type_name(GgufType t) {
  for (const TypeName& n : kTypeNames)
    if (n.type == t) return n.name;
  return "?";
}

GgufExportSummary export_gguf(const std::string& checkpoint, const std::string& out_path,
                              const GgufExportOptions& options) {
  core::check_output_file(out_path);  // before the model is loaded
  core::check_output_not_input(out_path, checkpoint);
  const std::string dir = train::require_checkpoint(checkpoint);
  train::TrainState state;
  const models::GptConfig cfg = train::read_checkpoint_config(dir, &state);
  // Every quantized row is n_embd or 4 n_embd long: whole blocks when n_embd is.
  const int64_t block = is_k_quant(options.type) ? ggml::kSuperBlock
                        : (options.type == GgufType::q8_0 || options.type == GgufType::q4_0) ? 32
                                                                                               : 1;
  if (cfg.n_embd % block != 0)
    throw core::ConfigError(std::string(gguf_type_name(options.type)) + " needs n_embd to be a multiple of " +
                            std::to_string(block) + " (the block length along each weight row); this model has " +
                            "n_embd " + std::to_string(cfg.n_embd) +
                            (block == ggml::kSuperBlock && cfg.n_embd % 32 == 0 ? ": use q8_0 or q4_0 (blocks of 32)"
                             : block > 1                                        ? ": use f16 or f32"
                                                                                : ""));
  const std::string tokenizer = state.tokenizer.empty() ? "gpt2" : state.tokenizer;
  cpu::CpuBackend backend(1);
  models::Gpt model(cfg, backend);
  train::load_checkpoint(dir, model, nullptr);

  GgufExportSummary s;
  Metadata md;
  md.str("general.architecture", "gpt2");
  md.str("general.name", "brisk " + std::to_string(cfg.n_layer) + "x" + std::to_string(cfg.n_embd) + " step " +
                             std::to_string(state.step));
  md.u32("general.file_type", file_type(options.type));
  md.u32("general.alignment", uint32_t(kAlignment));
  md.u32("gpt2.context_length", uint32_t(cfg.block_size));
  md.u32("gpt2.embedding_length", uint32_t(cfg.n_embd));
  md.u32("gpt2.feed_forward_length", uint32_t(4 * cfg.n_embd));
  md.u32("gpt2.block_count", uint32_t(cfg.n_layer));
  md.u32("gpt2.attention.head_count", uint32_t(cfg.n_head));
  md.f32("gpt2.attention.layer_norm_epsilon", kLayerNormEps);
  write_vocab(md, tokenizer, options.vocab_dir, cfg.vocab_size, s.vocab_tokens);

  const GgufType t = options.type;
  const int64_t L = cfg.n_layer;
  std::vector<TensorOut> tensors;
  // The token embedding is also the LM head (the file has no output.weight).
  tensors.push_back(tensor(model, "wte.weight", "token_embd.weight", weight_type(t, Role::token_embd, 0, L)));
  tensors.push_back(tensor(model, "wpe.weight", "position_embd.weight"));
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "h." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
    struct Layer {
      const char *from, *to;
      std::optional<Role> linear;  // empty for a LayerNorm (f32)
    };
    for (const Layer& x : {Layer{"ln_1", "attn_norm", {}}, Layer{"attn.c_attn", "attn_qkv", Role::attn_qkv},
                           Layer{"attn.c_proj", "attn_output", Role::attn_output}, Layer{"ln_2", "ffn_norm", {}},
                           Layer{"mlp.c_fc", "ffn_up", Role::ffn_up}, Layer{"mlp.c_proj", "ffn_down", Role::ffn_down}}) {
      const ggml::Type w = x.linear ? weight_type(t, *x.linear, l, L) : ggml::Type::f32;
      tensors.push_back(tensor(model, b + x.from + ".weight", g + x.to + ".weight", w));
      tensors.push_back(tensor(model, b + x.from + ".bias", g + x.to + ".bias"));
    }
  }
  tensors.push_back(tensor(model, "ln_f.weight", "output_norm.weight"));
  tensors.push_back(tensor(model, "ln_f.bias", "output_norm.bias"));
  for (const TensorOut& o : tensors) ++s.tensors_by_type[ggml::type_name(o.type)];

  Bytes head;
  head.raw("GGUF", 4);
  head.put(kGgufVersion);
  head.put(uint64_t(tensors.size()));
  head.put(md.count());
  head.raw(md.bytes().data().data(), md.bytes().size());
  uint64_t offset = 0;
  for (const TensorOut& o : tensors) {
    head.str(o.name);
    head.put(uint32_t(o.dims.size()));
    for (uint64_t d : o.dims) head.put(d);
    head.put(uint32_t(o.type));
    head.put(offset);
    offset += (o.data.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  head.pad_to(kAlignment);

  core::AtomicFile f(out_path);
  f.write(head.data().data(), head.size());
  s.bytes = head.size();
  static const char zeros[kAlignment] = {};
  for (const TensorOut& o : tensors) {
    f.write(o.data.data(), o.data.size());
    const size_t pad = (kAlignment - o.data.size() % kAlignment) % kAlignment;
    f.write(zeros, pad);
    s.bytes += o.data.size() + pad;
  }
  f.commit();
  s.checkpoint_dir = dir;
  s.out_path = out_path;
  s.config = cfg;
  s.tokenizer = tokenizer;
  s.tensors = int64_t(tensors.size());
  return s;
}

}  // namespace brisk::exporter
