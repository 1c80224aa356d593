// The GPT as an ONNX graph (onnx_gpt.h). Shapes: B batch, T seq (both
// symbolic), C n_embd, H heads of D = C / H, V vocab.
//
//   input_ids (B, T) int64
//   x = Gather(wte, ids) + Slice(wpe, rows [0, T))               (B, T, C)
//   n_layer times:
//     x += c_proj(attention(c_attn(LayerNormalization(x, ln_1))))
//     x += c_proj(gelu_tanh(c_fc(LayerNormalization(x, ln_2))))
//   logits = Gemm(LayerNormalization(x, ln_f) as (B*T, C), wte, transB) -> (B, T, V)
//
// Every Linear is MatMul + Add with its weight stored (in, out), which is
// Hugging Face's Conv1D layout, so the initializers have model.safetensors'
// names and layouts. The head reuses wte through Gemm's transB instead of a
// transposed copy, keeping the file the size of the weights.
#include "onnx_gpt.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "onnx_graph.h"

namespace brisk::exporter {

namespace {

constexpr float kLayerNormEps = 1e-5f;  // models::Gpt's LayerNorms
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

class GptGraph {
 public:
  GptGraph(const models::Gpt& model, onnx::GraphProto& graph)
      : model_(model), graph_(graph), g_(graph), C_(model.config().n_embd), H_(model.config().n_head) {}

  GptGraphStats build();

 private:
  // A parameter of the model as a float32 initializer under its own name;
  // Linear weights (brisk keeps them (out, in)) are transposed to (in, out).
  std::string param(const std::string& name, bool transpose = false);
  std::string layernorm(const std::string& x, const std::string& prefix);
  std::string linear(const std::string& x, const std::string& prefix);
  std::string gelu(const std::string& x, const std::string& prefix);
  std::string attention(const std::string& x, const std::string& prefix);
  std::string block(const std::string& x, int64_t layer);
  void shared_constants();

  const models::Gpt& model_;
  onnx::GraphProto& graph_;
  OnnxGraph g_;
  int64_t C_, H_;
  int64_t parameters_ = 0;
  std::string mask_;  // (T, T) bool, true where a query may attend to a key
};

std::string GptGraph::param(const std::string& name, bool transpose) {
  const core::ParameterStore& store = model_.params();
  const core::Tensor t = store.download(store.at(name).value);  // fp32 master weights, on the host
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

std::string GptGraph::layernorm(const std::string& x, const std::string& prefix) {
  // LayerNormalization is in opset 17; stash_type 1 keeps mean and variance in fp32.
  return g_.op("LayerNormalization", {x, param(prefix + ".weight"), param(prefix + ".bias")}, prefix,
               {attr_int("axis", -1), attr_float("epsilon", kLayerNormEps), attr_int("stash_type", 1)});
}

std::string GptGraph::linear(const std::string& x, const std::string& prefix) {
  const std::string y = g_.op("MatMul", {x, param(prefix + ".weight", true)}, prefix + ".matmul");
  return g_.op("Add", {y, param(prefix + ".bias")}, prefix);
}

// GELU is no opset-17 op: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// the tanh form brisk trains with (src/ops/activation.cpp).
std::string GptGraph::gelu(const std::string& x, const std::string& prefix) {
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

// Causal self-attention over c_attn's (B, T, 3C) output, columns [q, k, v]
// with the heads contiguous inside each (as brisk's attention op reads them).
std::string GptGraph::attention(const std::string& x, const std::string& prefix) {
  const std::string qkv = linear(x, prefix + ".c_attn");
  const auto parts = g_.op_multi("Split", {qkv, "const.qkv_split"}, prefix + ".split",
                                 {prefix + ".q", prefix + ".k", prefix + ".v"}, {attr_int("axis", 2)});
  auto heads = [&](const std::string& v, const std::vector<int64_t>& perm, const std::string& name) {
    const std::string r = g_.op("Reshape", {v, "const.split_heads"}, name + ".heads");  // (B, T, H, D)
    return g_.op("Transpose", {r}, name + ".t", {attr_ints("perm", perm)});
  };
  const std::string q = heads(parts[0], {0, 2, 1, 3}, parts[0]);   // (B, H, T, D)
  const std::string kt = heads(parts[1], {0, 2, 3, 1}, parts[1]);  // (B, H, D, T)
  const std::string v = heads(parts[2], {0, 2, 1, 3}, parts[2]);   // (B, H, T, D)
  const std::string s = g_.op("MatMul", {q, kt}, prefix + ".scores");
  const std::string ss = g_.op("Mul", {s, "const.attn_scale"}, prefix + ".scaled");
  // Where, not an additive mask: a masked score becomes exactly the lowest
  // float, whose exp underflows to 0, like the keys brisk never visits.
  const std::string masked = g_.op("Where", {mask_, ss, "const.masked_score"}, prefix + ".masked");
  const std::string p = g_.op("Softmax", {masked}, prefix + ".probs", {attr_int("axis", -1)});
  const std::string y = g_.op("MatMul", {p, v}, prefix + ".context");  // (B, H, T, D)
  const std::string yt = g_.op("Transpose", {y}, prefix + ".context.t", {attr_ints("perm", {0, 2, 1, 3})});
  const std::string merged = g_.op("Reshape", {yt, "const.merge_heads"}, prefix + ".merged");  // (B, T, C)
  return linear(merged, prefix + ".c_proj");
}

std::string GptGraph::block(const std::string& x, int64_t layer) {
  const std::string p = "h." + std::to_string(layer);
  const std::string a = attention(layernorm(x, p + ".ln_1"), p + ".attn");
  const std::string x1 = g_.op("Add", {x, a}, p + ".residual_attn");
  const std::string h = gelu(linear(layernorm(x1, p + ".ln_2"), p + ".mlp.c_fc"), p + ".mlp.gelu");
  const std::string m = linear(h, p + ".mlp.c_proj");
  return g_.op("Add", {x1, m}, p + ".residual_mlp");
}

void GptGraph::shared_constants() {
  const int64_t D = C_ / H_, block = model_.config().block_size;
  g_.f32_scalar("const.gelu_cubic", kGeluCubic);
  g_.f32_scalar("const.sqrt_2_over_pi", kSqrt2OverPi);
  g_.f32_scalar("const.one", 1.f);
  g_.f32_scalar("const.half", 0.5f);
  g_.f32_scalar("const.attn_scale", float(1.0 / std::sqrt(double(D))));
  g_.f32_scalar("const.masked_score", std::numeric_limits<float>::lowest());
  g_.i64("const.qkv_split", {C_, C_, C_});
  g_.i64("const.split_heads", {0, 0, H_, D});  // 0: keep that input dimension (B, T)
  g_.i64("const.merge_heads", {0, 0, C_});
  g_.i64("const.flat_rows", {-1, C_});
  g_.i64("const.vocab", {model_.config().vocab_size});
  g_.i64("const.zero", {0});
  g_.i64("const.one_i64", {1});
  g_.i64("const.two", {2});
  g_.i64("const.zeros2", {0, 0});
  g_.i64("const.axes01", {0, 1});
  // The causal mask for the longest sequence; each run slices its (T, T) corner.
  std::vector<uint8_t> tril(size_t(block * block), 0);
  for (int64_t i = 0; i < block; ++i)
    for (int64_t j = 0; j <= i; ++j) tril[size_t(i * block + j)] = 1;
  g_.boolean("const.causal_mask", {block, block}, tril);
}

GptGraphStats GptGraph::build() {
  const models::GptConfig& cfg = model_.config();
  onnx::GraphProto& graph = graph_;
  graph.set_name("brisk_gpt");

  onnx::ValueInfoProto* in = graph.add_input();
  in->set_name(kInputName);
  in->set_doc_string("token ids in [0, " + std::to_string(cfg.vocab_size) + "); seq at most " +
                     std::to_string(cfg.block_size));
  onnx::TypeProto_Tensor* it = in->mutable_type()->mutable_tensor_type();
  it->set_elem_type(onnx::TensorProto::INT64);
  it->mutable_shape()->add_dim()->set_dim_param("batch");
  it->mutable_shape()->add_dim()->set_dim_param("seq");

  onnx::ValueInfoProto* out = graph.add_output();
  out->set_name(kOutputName);
  out->set_doc_string("next-token logits at every position");
  onnx::TypeProto_Tensor* ot = out->mutable_type()->mutable_tensor_type();
  ot->set_elem_type(onnx::TensorProto::FLOAT);
  ot->mutable_shape()->add_dim()->set_dim_param("batch");
  ot->mutable_shape()->add_dim()->set_dim_param("seq");
  ot->mutable_shape()->add_dim()->set_dim_value(cfg.vocab_size);

  shared_constants();

  // --- embeddings and the (T, T) mask, from the input's run-time shape
  const std::string shape = g_.op("Shape", {kInputName}, "input_shape");  // [B, T]
  const std::string seq = g_.op("Slice", {shape, "const.one_i64", "const.two"}, "seq_len");  // [T]
  const std::string wte = param("wte.weight");
  const std::string tok = g_.op("Gather", {wte, kInputName}, "tok_emb", {attr_int("axis", 0)});
  const std::string pos = g_.op("Slice", {param("wpe.weight"), "const.zero", seq, "const.zero"}, "pos_emb");
  std::string x = g_.op("Add", {tok, pos}, "embed");
  const std::string mask_end = g_.op("Concat", {seq, seq}, "mask_end", {attr_int("axis", 0)});
  mask_ = g_.op("Slice", {"const.causal_mask", "const.zeros2", mask_end, "const.axes01"}, "causal_mask");

  for (int64_t l = 0; l < cfg.n_layer; ++l) x = block(x, l);

  // --- final LayerNorm and the head tied to wte
  const std::string h = layernorm(x, "ln_f");
  const std::string flat = g_.op("Reshape", {h, "const.flat_rows"}, "ln_f.flat");  // (B*T, C)
  const std::string l2 = g_.op("Gemm", {flat, wte}, "lm_head", {attr_int("transB", 1)});  // (B*T, V)
  const std::string out_shape = g_.op("Concat", {shape, "const.vocab"}, "logits_shape", {attr_int("axis", 0)});
  g_.op("Reshape", {l2, out_shape}, kOutputName);

  return {g_.nodes(), g_.initializers(), parameters_};
}

}  // namespace

GptGraphStats build_gpt_graph(const models::Gpt& model, onnx::GraphProto& graph) {
  return GptGraph(model, graph).build();
}

}  // namespace brisk::exporter
