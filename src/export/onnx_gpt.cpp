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
// The blocks are onnx_blocks.cpp's. The head reuses wte through Gemm's
// transB instead of a transposed copy, keeping the file the size of the
// weights.
#include "onnx_gpt.h"

#include <string>
#include <vector>

#include "onnx_graph.h"

namespace brisk::exporter {

namespace {

class GptGraph {
 public:
  GptGraph(const models::Gpt& model, onnx::GraphProto& graph, bool kv_cache)
      : model_(model),
        graph_(graph),
        g_(graph),
        blocks_(model.params(), g_, model.config().n_embd, model.config().n_head, kv_cache),
        C_(model.config().n_embd),
        H_(model.config().n_head),
        kv_cache_(kv_cache) {}

  GraphStats build();

 private:
  void declare_interface();
  void constants();

  const models::Gpt& model_;
  onnx::GraphProto& graph_;
  OnnxGraph g_;
  BlockWriter blocks_;
  int64_t C_, H_;
  bool kv_cache_;
};

void GptGraph::constants() {
  const int64_t block = model_.config().block_size;
  blocks_.constants();
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

GraphStats GptGraph::build() {
  const models::GptConfig& cfg = model_.config();
  graph_.set_name("brisk_gpt");
  declare_interface();
  constants();

  // --- embeddings and the causal mask, from the inputs' run-time shapes
  const std::string shape = g_.op("Shape", {kInputName}, "input_shape");  // [B, T]
  const std::string seq = g_.op("Slice", {shape, "const.one_i64", "const.two"}, "seq_len");  // [T]
  std::string first = "const.zero", last = seq;  // the queries' rows of the causal mask, [P, P + T)
  if (kv_cache_) {
    const std::string past_shape = g_.op("Shape", {past_name(0, "key")}, "past_shape");  // [B, H, P, D]
    first = g_.op("Slice", {past_shape, "const.two", "const.three"}, "past_len");         // [P]
    last = g_.op("Add", {first, seq}, "total_len");                                       // [P + T]
  }
  const std::string wte = blocks_.param("wte.weight");
  const std::string tok = g_.op("Gather", {wte, kInputName}, "tok_emb", {attr_int("axis", 0)});
  const std::string pos =
      kv_cache_ ? g_.op("Gather", {blocks_.param("wpe.weight"), kPositionsName}, "pos_emb", {attr_int("axis", 0)})
                : g_.op("Slice", {blocks_.param("wpe.weight"), first, last, "const.zero"}, "pos_emb");
  std::string x = g_.op("Add", {tok, pos}, "embed");
  // Rows [P, P + T) (the queries), columns [0, P + T) (the keys).
  const std::string mask_start =
      kv_cache_ ? g_.op("Concat", {first, "const.zero"}, "mask_start", {attr_int("axis", 0)}) : "const.zeros2";
  const std::string mask_end = g_.op("Concat", {last, last}, "mask_end", {attr_int("axis", 0)});
  std::string mask = g_.op("Slice", {"const.causal_mask", mask_start, mask_end, "const.axes01"}, "causal_mask");
  if (kv_cache_) {  // and only the keys attention_mask keeps: (T, P + T) & (B, 1, 1, P + T)
    const std::string keep = g_.op("Cast", {kAttentionMaskName}, "keep", {attr_int("to", onnx::TensorProto::BOOL)});
    const std::string keep4 = g_.op("Unsqueeze", {keep, "const.axes12"}, "keep.b11k");
    mask = g_.op("And", {mask, keep4}, "attention_mask.causal");  // (B, 1, T, P + T)
  }

  for (int64_t l = 0; l < cfg.n_layer; ++l) x = blocks_.block(x, l, mask);

  // --- final LayerNorm and the head tied to wte
  const std::string h = blocks_.layernorm(x, "ln_f");
  const std::string flat = g_.op("Reshape", {h, "const.flat_rows"}, "ln_f.flat");  // (B*T, C)
  const std::string l2 = g_.op("Gemm", {flat, wte}, "lm_head", {attr_int("transB", 1)});  // (B*T, V)
  const std::string out_shape = g_.op("Concat", {shape, "const.vocab"}, "logits_shape", {attr_int("axis", 0)});
  g_.op("Reshape", {l2, out_shape}, kOutputName);

  return {g_.nodes(), g_.initializers(), blocks_.parameters()};
}

}  // namespace

GraphStats build_gpt_graph(const models::Gpt& model, onnx::GraphProto& graph, bool kv_cache) {
  return GptGraph(model, graph, kv_cache).build();
}

}  // namespace brisk::exporter
