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
// The KV-cache variant also takes each layer's keys and values of P earlier
// positions, (B, H, P, D), P read from the first layer's past keys at run
// time (0 for a prompt), with attention_mask (B, P + T) and position_ids
// (B, T), so that rows of different lengths can share a batch (left padding).
// Its position embeddings are rows position_ids of wpe; each layer appends
// input_ids' keys and values to the past ones (Concat on the length axis,
// returned as the layer's present); query i attends to key j where j <= P + i
// (rows [P, P + T) and columns [0, P + T) of the causal mask) and
// attention_mask[b, j] is 1.
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

// A tensor dimension of a graph input or output: a size, or a symbol.
struct Dim {
  int64_t value = 0;
  std::string symbol;
};

void declare(onnx::ValueInfoProto* v, const std::string& name, int32_t elem_type, const std::vector<Dim>& dims,
             const std::string& doc) {
  v->set_name(name);
  v->set_doc_string(doc);
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem_type);
  for (const Dim& d : dims) {
    onnx::TensorShapeProto_Dimension* out = t->mutable_shape()->add_dim();
    if (d.symbol.empty()) out->set_dim_value(d.value);
    else out->set_dim_param(d.symbol);
  }
}

class GptGraph {
 public:
  GptGraph(const models::Gpt& model, onnx::GraphProto& graph, bool kv_cache)
      : model_(model),
        graph_(graph),
        g_(graph),
        C_(model.config().n_embd),
        H_(model.config().n_head),
        kv_cache_(kv_cache) {}

  GptGraphStats build();

 private:
  // A parameter of the model as a float32 initializer under its own name;
  // Linear weights (brisk keeps them (out, in)) are transposed to (in, out).
  std::string param(const std::string& name, bool transpose = false);
  std::string layernorm(const std::string& x, const std::string& prefix);
  std::string linear(const std::string& x, const std::string& prefix);
  std::string gelu(const std::string& x, const std::string& prefix);
  std::string attention(const std::string& x, int64_t layer);
  void declare_interface();
  std::string block(const std::string& x, int64_t layer);
  void shared_constants();

  const models::Gpt& model_;
  onnx::GraphProto& graph_;
  OnnxGraph g_;
  int64_t C_, H_;
  bool kv_cache_;
  int64_t parameters_ = 0;
  std::string mask_;  // (T, P + T) bool, true where a query may attend to a key (P = 0 without a cache)
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
// With the KV cache, k and v are appended to the layer's past ones first.
std::string GptGraph::attention(const std::string& x, int64_t layer) {
  const std::string prefix = "h." + std::to_string(layer) + ".attn";
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
  const std::string s = g_.op("MatMul", {q, kt}, prefix + ".scores");  // (B, H, T, P + T)
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
  const std::string a = attention(layernorm(x, p + ".ln_1"), layer);
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
  if (kv_cache_) g_.i64("const.three", {3});
  if (kv_cache_) g_.i64("const.axes12", {1, 2});
  if (!kv_cache_) g_.i64("const.zeros2", {0, 0});
  g_.i64("const.axes01", {0, 1});
  // The causal mask for the longest sequence; each run slices its (T, T) corner.
  std::vector<uint8_t> tril(size_t(block * block), 0);
  for (int64_t i = 0; i < block; ++i)
    for (int64_t j = 0; j <= i; ++j) tril[size_t(i * block + j)] = 1;
  g_.boolean("const.causal_mask", {block, block}, tril);
}

void GptGraph::declare_interface() {
  const models::GptConfig& cfg = model_.config();
  const Dim batch{0, "batch"}, seq{0, "seq"}, heads{H_, ""}, head_dim{C_ / H_, ""};
  declare(graph_.add_input(), kInputName, onnx::TensorProto::INT64, {batch, seq},
          "token ids in [0, " + std::to_string(cfg.vocab_size) + "); seq at most " + std::to_string(cfg.block_size) +
              (kv_cache_ ? " minus the past length" : ""));
  declare(graph_.add_output(), kOutputName, onnx::TensorProto::FLOAT, {batch, seq, Dim{cfg.vocab_size, ""}},
          "next-token logits at every position");
  if (!kv_cache_) return;
  const Dim total{0, "past_seq + seq"};
  declare(graph_.add_input(), kAttentionMaskName, onnx::TensorProto::INT64, {batch, total},
          "1 for the positions to attend to (past and new), 0 for padding");
  declare(graph_.add_input(), kPositionsName, onnx::TensorProto::INT64, {batch, seq},
          "input_ids' positions in [0, " + std::to_string(cfg.block_size) + "): the row's real tokens before them");
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    for (const char* kv : {"key", "value"})
      declare(graph_.add_input(), past_name(l, kv), onnx::TensorProto::FLOAT,
              {batch, heads, Dim{0, "past_seq"}, head_dim},
              std::string("the layer's ") + kv + "s of the positions before input_ids (past_seq 0 for a prompt)");
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    for (const char* kv : {"key", "value"})
      declare(graph_.add_output(), present_name(l, kv), onnx::TensorProto::FLOAT, {batch, heads, total, head_dim},
              std::string("the past ") + kv + "s followed by input_ids' own: the next call's past");
}

GptGraphStats GptGraph::build() {
  const models::GptConfig& cfg = model_.config();
  graph_.set_name("brisk_gpt");
  declare_interface();
  shared_constants();

  // --- embeddings and the causal mask, from the inputs' run-time shapes
  const std::string shape = g_.op("Shape", {kInputName}, "input_shape");  // [B, T]
  const std::string seq = g_.op("Slice", {shape, "const.one_i64", "const.two"}, "seq_len");  // [T]
  std::string first = "const.zero", last = seq;  // the queries' rows of the causal mask, [P, P + T)
  if (kv_cache_) {
    const std::string past_shape = g_.op("Shape", {past_name(0, "key")}, "past_shape");  // [B, H, P, D]
    first = g_.op("Slice", {past_shape, "const.two", "const.three"}, "past_len");         // [P]
    last = g_.op("Add", {first, seq}, "total_len");                                       // [P + T]
  }
  const std::string wte = param("wte.weight");
  const std::string tok = g_.op("Gather", {wte, kInputName}, "tok_emb", {attr_int("axis", 0)});
  const std::string pos =
      kv_cache_ ? g_.op("Gather", {param("wpe.weight"), kPositionsName}, "pos_emb", {attr_int("axis", 0)})
                : g_.op("Slice", {param("wpe.weight"), first, last, "const.zero"}, "pos_emb");
  std::string x = g_.op("Add", {tok, pos}, "embed");
  // Rows [P, P + T) (the queries), columns [0, P + T) (the keys).
  const std::string mask_start =
      kv_cache_ ? g_.op("Concat", {first, "const.zero"}, "mask_start", {attr_int("axis", 0)}) : "const.zeros2";
  const std::string mask_end = g_.op("Concat", {last, last}, "mask_end", {attr_int("axis", 0)});
  mask_ = g_.op("Slice", {"const.causal_mask", mask_start, mask_end, "const.axes01"}, "causal_mask");
  if (kv_cache_) {  // and only the keys attention_mask keeps: (T, P + T) & (B, 1, 1, P + T)
    const std::string keep = g_.op("Cast", {kAttentionMaskName}, "keep", {attr_int("to", onnx::TensorProto::BOOL)});
    const std::string keep4 = g_.op("Unsqueeze", {keep, "const.axes12"}, "keep.b11k");
    mask_ = g_.op("And", {mask_, keep4}, "attention_mask.causal");  // (B, 1, T, P + T)
  }

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

std::string past_name(int64_t layer, const char* kv) {
  return "past_key_values." + std::to_string(layer) + "." + kv;
}

std::string present_name(int64_t layer, const char* kv) {
  return "present." + std::to_string(layer) + "." + kv;
}

GptGraphStats build_gpt_graph(const models::Gpt& model, onnx::GraphProto& graph, bool kv_cache) {
  return GptGraph(model, graph, kv_cache).build();
}

}  // namespace brisk::exporter
