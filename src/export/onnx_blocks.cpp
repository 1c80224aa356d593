// BlockWriter (onnx_blocks.h): the shared pre-LayerNorm block as ONNX nodes.
// Shapes: B batch, T seq (symbolic), C n_embd, H heads of D = C / H; with
// the KV cache, P earlier positions.
//
// Every Linear is MatMul + Add with its weight stored (in, out), Hugging
// Face's Conv1D layout, so the initializers have model.safetensors' names
// and layouts.
#include "onnx_blocks.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace brisk::exporter {

namespace {

constexpr float kLayerNormEps = 1e-5f;  // every LayerNorm of brisk's models
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

}  // namespace

std::string past_name(int64_t layer, const char* kv) {
  return "past_key_values." + std::to_string(layer) + "." + kv;
}

std::string present_name(int64_t layer, const char* kv) {
  return "present." + std::to_string(layer) + "." + kv;
}

BlockWriter::BlockWriter(const core::ParameterStore& params, OnnxGraph& g, int64_t n_embd, int64_t n_head,
                         bool kv_cache, std::string prefix)
    : params_(params), g_(g), C_(n_embd), H_(n_head), kv_cache_(kv_cache), prefix_(std::move(prefix)) {}

void BlockWriter::constants() {
  const int64_t D = C_ / H_;
  g_.f32_scalar("const.gelu_cubic", kGeluCubic);
  g_.f32_scalar("const.sqrt_2_over_pi", kSqrt2OverPi);
  g_.f32_scalar("const.one", 1.f);
  g_.f32_scalar("const.half", 0.5f);
  g_.f32_scalar("const.attn_scale", float(1.0 / std::sqrt(double(D))));
  g_.f32_scalar("const.masked_score", std::numeric_limits<float>::lowest());
  g_.i64("const.qkv_split", {C_, C_, C_});
  g_.i64("const.split_heads", {0, 0, H_, D});  // 0: keep that input dimension (B, T)
  g_.i64("const.merge_heads", {0, 0, C_});
}

std::string BlockWriter::param(const std::string& name, bool transpose) {
  const core::Tensor t = params_.download(params_.at(name).value);  // fp32 master weights, on the host
  const float* src = t.data_as<float>();
  parameters_ += t.numel();
  std::vector<int64_t> dims(t.shape().begin(), t.shape().end());
  if (!transpose) return g_.f32(name, dims, src);
  const int64_t rows = dims[0], cols = dims[1];
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = src[r * cols + c];
  return g_.f32(name, {cols, rows}, out.data());
}

std::string BlockWriter::layernorm(const std::string& x, const std::string& prefix) {
  // LayerNormalization is in opset 17; stash_type 1 keeps mean and variance in fp32.
  return g_.op("LayerNormalization", {x, param(prefix + ".weight"), param(prefix + ".bias")}, prefix,
               {attr_int("axis", -1), attr_float("epsilon", kLayerNormEps), attr_int("stash_type", 1)});
}

std::string BlockWriter::linear(const std::string& x, const std::string& prefix) {
  const std::string y = g_.op("MatMul", {x, param(prefix + ".weight", true)}, prefix + ".matmul");
  return g_.op("Add", {y, param(prefix + ".bias")}, prefix);
}

// GELU is no opset-17 op: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// the tanh form brisk trains with (src/ops/activation.cpp).
std::string BlockWriter::gelu(const std::string& x, const std::string& prefix) {
  const std::string x2 = g_.op("Mul", {x, x}, prefix + ".x2");
  const std::string x3 = g_.op("Mul", {x2, x}, prefix + ".x3");
  const std::string cx3 = g_.op("Mul", {x3, "const.gelu_cubic"}, prefix + ".cx3");
  const std::string inner = g_.op("Add", {x, cx3}, prefix + ".inner");
  const std::string scaled = g_.op("Mul", {inner, "const.sqrt_2_over_pi"}, prefix + ".scaled");
  const std::string t = g_.op("Tanh", {scaled}, prefix + ".tanh");
  const std::string one_plus = g_.op("Add", {t, "const.one"}, prefix + ".one_plus");
  const std::string half_x = g_.op("Mul", {x, "const.half"}, prefix + ".half_x");
  return g_.op("Mul", {half_x, one_plus}, prefix);
}

// Self-attention over c_attn's (B, T, 3C) output, columns [q, k, v] with the
// heads contiguous inside each (as brisk's attention ops read them). With
// the KV cache, k and v are appended to the layer's past ones first.
std::string BlockWriter::attention(const std::string& x, int64_t layer, const std::string& mask) {
  const std::string prefix = prefix_ + "h." + std::to_string(layer) + ".attn";
  const std::string qkv = linear(x, prefix + ".c_attn");
  const auto parts = g_.op_multi("Split", {qkv, "const.qkv_split"}, prefix + ".split",
                                 {prefix + ".q", prefix + ".k", prefix + ".v"}, {attr_int("axis", 2)});
  auto heads = [&](const std::string& v, const std::vector<int64_t>& perm, const std::string& name) {
    const std::string r = g_.op("Reshape", {v, "const.split_heads"}, name + ".heads");  // (B, T, H, D)
    return g_.op("Transpose", {r}, name + ".t", {attr_ints("perm", perm)});
  };
  const std::string q = heads(parts[0], {0, 2, 1, 3}, parts[0]);  // (B, H, T, D)
  std::string kt, v;
  if (kv_cache_) {
    const std::string k = heads(parts[1], {0, 2, 1, 3}, parts[1]);  // (B, H, T, D)
    const std::string present_k = g_.op("Concat", {past_name(layer, "key"), k}, present_name(layer, "key"),
                                        {attr_int("axis", 2)});  // (B, H, P + T, D)
    kt = g_.op("Transpose", {present_k}, prefix + ".kt", {attr_ints("perm", {0, 1, 3, 2})});
    v = g_.op("Concat", {past_name(layer, "value"), heads(parts[2], {0, 2, 1, 3}, parts[2])},
              present_name(layer, "value"), {attr_int("axis", 2)});
  } else {
    kt = heads(parts[1], {0, 2, 3, 1}, parts[1]);  // (B, H, D, T)
    v = heads(parts[2], {0, 2, 1, 3}, parts[2]);   // (B, H, T, D)
  }
  const std::string s = g_.op("MatMul", {q, kt}, prefix + ".scores");  // (B, H, T, keys)
  const std::string ss = g_.op("Mul", {s, "const.attn_scale"}, prefix + ".scaled");
  // Where, not an additive mask: a masked score becomes exactly the lowest
  // float, whose exp underflows to 0, like the keys brisk never visits.
  const std::string masked = g_.op("Where", {mask, ss, "const.masked_score"}, prefix + ".masked");
  const std::string p = g_.op("Softmax", {masked}, prefix + ".probs", {attr_int("axis", -1)});
  const std::string y = g_.op("MatMul", {p, v}, prefix + ".context");  // (B, H, T, D)
  const std::string yt = g_.op("Transpose", {y}, prefix + ".context.t", {attr_ints("perm", {0, 2, 1, 3})});
  const std::string merged = g_.op("Reshape", {yt, "const.merge_heads"}, prefix + ".merged");  // (B, T, C)
  return linear(merged, prefix + ".c_proj");
}

std::string BlockWriter::block(const std::string& x, int64_t layer, const std::string& mask) {
  const std::string p = prefix_ + "h." + std::to_string(layer);
  const std::string a = attention(layernorm(x, p + ".ln_1"), layer, mask);
  const std::string x1 = g_.op("Add", {x, a}, p + ".residual_attn");
  const std::string h = gelu(linear(layernorm(x1, p + ".ln_2"), p + ".mlp.c_fc"), p + ".mlp.gelu");
  const std::string m = linear(h, p + ".mlp.c_proj");
  return g_.op("Add", {x1, m}, p + ".residual_mlp");
}

}  // namespace brisk::exporter
