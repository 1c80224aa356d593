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
#include <vector>

#include "brisk/core/atomic_file.h"
#include "brisk/core/dtype.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/tokenizer.h"
#include "brisk/train/checkpoint.h"

namespace brisk::exporter {

namespace {

constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kAlignment = 32;
constexpr float kLayerNormEps = 1e-5f;  // models::Gpt's LayerNorms

// GGUF metadata value types and ggml tensor types (ggml.h, gguf.h).
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kString = 8, kArray = 9 };
enum : uint32_t { kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ8_0 = 8 };
// llama.cpp's token types and file types.
enum : int32_t { kTokenNormal = 1, kTokenControl = 3 };
uint32_t file_type(GgufType t) {
  switch (t) {
    case GgufType::f32: return 0;   // LLAMA_FTYPE_ALL_F32
    case GgufType::f16: return 1;   // MOSTLY_F16
    case GgufType::q4_0: return 2;  // MOSTLY_Q4_0
    case GgufType::q8_0: return 7;  // MOSTLY_Q8_0
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

// ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref):
// blocks of 32 along the row, an f16 scale each.
void quantize_q8_0(const float* x, int64_t n, Bytes& out) {
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
    out.put(core::f32_to_f16(d));
    for (int j = 0; j < 32; ++j) out.put(int8_t(std::lround(x[b + j] * id)));
  }
}

void quantize_q4_0(const float* x, int64_t n, Bytes& out) {
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0, max = 0;  // the value of largest magnitude, with its sign
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[b + j]) > amax) amax = std::fabs(x[b + j]), max = x[b + j];
    const float d = max / -8.f, id = d != 0 ? 1.f / d : 0.f;
    out.put(core::f32_to_f16(d));
    for (int j = 0; j < 16; ++j) {
      const auto code = [&](float v) { return uint8_t(std::min(15, int(int8_t(v * id + 8.5f)))); };
      out.put(uint8_t(code(x[b + j]) | code(x[b + j + 16]) << 4));
    }
  }
}

struct TensorOut {
  std::string name;
  std::vector<uint64_t> dims;  // innermost first
  uint32_t type;
  Bytes data;
};

// A parameter as a GGUF tensor: 2-D weights in `type` (rows of dims[0]),
// everything else f32.
TensorOut tensor(const models::Gpt& model, const std::string& brisk_name, const std::string& gguf_name, GgufType type) {
  const core::ParameterStore& store = model.params();
  const core::Tensor t = store.download(store.at(brisk_name).value);
  const float* x = t.data_as<float>();
  TensorOut o;
  o.name = gguf_name;
  for (int d = t.shape().rank() - 1; d >= 0; --d) o.dims.push_back(uint64_t(t.shape()[d]));
  const int64_t n = t.numel();
  const GgufType as = t.shape().rank() == 2 ? type : GgufType::f32;
  switch (as) {
    case GgufType::f32:
      o.type = kGgmlF32;
      o.data.raw(x, size_t(n) * sizeof(float));
      break;
    case GgufType::f16:
      o.type = kGgmlF16;
      for (int64_t i = 0; i < n; ++i) o.data.put(core::f32_to_f16(x[i]));
      break;
    case GgufType::q8_0:
      o.type = kGgmlQ8_0;
      quantize_q8_0(x, n, o.data);
      break;
    case GgufType::q4_0:
      o.type = kGgmlQ4_0;
      quantize_q4_0(x, n, o.data);
      break;
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

GgufType parse_gguf_type(const std::string& name) {
  if (name == "f32") return GgufType::f32;
  if (name == "f16") return GgufType::f16;
  if (name == "q8_0") return GgufType::q8_0;
  if (name == "q4_0") return GgufType::q4_0;
  throw core::ConfigError("--type '" + name + "': expected f32, f16, q8_0 or q4_0");
}

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::f32: return "f32";
    case GgufType::f16: return "f16";
    case GgufType::q8_0: return "q8_0";
    case GgufType::q4_0: return "q4_0";
  }
  return "?";
}

GgufExportSummary export_gguf(const std::string& checkpoint, const std::string& out_path,
                              const GgufExportOptions& options) {
  core::check_output_file(out_path);  // before the model is loaded
  core::check_output_not_input(out_path, checkpoint);
  const std::string dir = train::require_checkpoint(checkpoint);
  train::TrainState state;
  const models::GptConfig cfg = train::read_checkpoint_config(dir, &state);
  if ((options.type == GgufType::q8_0 || options.type == GgufType::q4_0) && cfg.n_embd % 32 != 0)
    throw core::ConfigError(std::string(gguf_type_name(options.type)) + " needs n_embd to be a multiple of 32 (the " +
                            "block size along each weight row); this model has n_embd " + std::to_string(cfg.n_embd));
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
  std::vector<TensorOut> tensors;
  tensors.push_back(tensor(model, "wte.weight", "token_embd.weight", t));  // also the LM head (no output.weight)
  tensors.push_back(tensor(model, "wpe.weight", "position_embd.weight", GgufType::f32));
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    const std::string b = "h." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"ln_1", "attn_norm"}, {"attn.c_attn", "attn_qkv"}, {"attn.c_proj", "attn_output"},
             {"ln_2", "ffn_norm"},  {"mlp.c_fc", "ffn_up"},        {"mlp.c_proj", "ffn_down"}}) {
      tensors.push_back(tensor(model, b + from + ".weight", g + to + ".weight", t));
      tensors.push_back(tensor(model, b + from + ".bias", g + to + ".bias", t));
    }
  }
  tensors.push_back(tensor(model, "ln_f.weight", "output_norm.weight", t));
  tensors.push_back(tensor(model, "ln_f.bias", "output_norm.bias", t));

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
    head.put(o.type);
    head.put(offset);
    offset += (o.data.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  head.pad_to(kAlignment);

  core::AtomicFile f(out_path);
  f.write(head.data().data(), head.size());
  s.bytes = head.size();
  static const char zeros[kAlignment] = {};
  for (const TensorOut& o : tensors) {
    f.write(o.data.data().data(), o.data.size());
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
