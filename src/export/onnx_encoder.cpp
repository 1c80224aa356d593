// The encoder classifier as an ONNX graph (onnx_encoder.h). Shapes: B batch,
// T seq (both symbolic), C n_embd, K n_classes.
//
//   input_ids, attention_mask (B, T) int64
//   keep = attention_mask != 0                                      (B, T)
//   x = Gather(wte, ids) + Slice(wpe, rows [0, T))                  (B, T, C)
//   n_layer blocks (onnx_blocks.cpp), every query attending to the keys
//   where keep is true: keep as (B, 1, 1, T)
//   h = LayerNormalization(x, ln_f)
//   pooled = sum over t of h * keep / sum over t of keep             (B, C)
//   logits = Gemm(pooled, head.weight, head.bias, transB)            (B, K)
//
// brisk's encoder takes right-padded rows and their lengths; a row whose
// attention_mask is 1 on its first `length` columns and 0 after is that
// row: attention masked at its padded keys, the mean over its real
// positions. Padded positions' own outputs are computed and dropped by the
// pooling, as brisk computes and drops them. head.weight stays (K, C) as in
// model.safetensors (Gemm's transB reads it).
#include "onnx_encoder.h"

#include <string>

#include "onnx_blocks.h"
#include "onnx_graph.h"

namespace brisk::exporter {

GraphStats build_encoder_graph(const models::Encoder& model, onnx::GraphProto& graph) {
  const models::EncoderConfig& cfg = model.config();
  OnnxGraph g(graph);
  BlockWriter blocks(model.params(), g, cfg.n_embd, cfg.n_head);
  graph.set_name("brisk_encoder_classifier");

  const Dim batch{0, "batch"}, seq{0, "seq"};
  declare(graph.add_input(), kInputName, onnx::TensorProto::INT64, {batch, seq},
          "token ids in [0, " + std::to_string(cfg.vocab_size) + "), rows right-padded; seq at most " +
              std::to_string(cfg.max_len));
  declare(graph.add_input(), kAttentionMaskName, onnx::TensorProto::INT64, {batch, seq},
          "1 on a row's real tokens, 0 on its padding (after them); every row needs at least one 1");
  declare(graph.add_output(), kOutputName, onnx::TensorProto::FLOAT, {batch, Dim{cfg.n_classes, ""}},
          "class logits of each row (softmax gives the probabilities brisk classify prints)");

  blocks.constants();
  g.i64("const.zero", {0});
  g.i64("const.one_i64", {1});
  g.i64("const.two", {2});
  g.i64("const.axes12", {1, 2});

  // --- embeddings; the seq length from input_ids' run-time shape
  const std::string shape = g.op("Shape", {kInputName}, "input_shape");              // [B, T]
  const std::string seq_len = g.op("Slice", {shape, "const.one_i64", "const.two"}, "seq_len");  // [T]
  const std::string tok =
      g.op("Gather", {blocks.param("wte.weight"), kInputName}, "tok_emb", {attr_int("axis", 0)});
  const std::string pos =
      g.op("Slice", {blocks.param("wpe.weight"), "const.zero", seq_len, "const.zero"}, "pos_emb");
  std::string x = g.op("Add", {tok, pos}, "embed");

  // --- the key mask: every query sees the row's real keys
  const std::string keep = g.op("Cast", {kAttentionMaskName}, "keep", {attr_int("to", onnx::TensorProto::BOOL)});
  const std::string key_mask = g.op("Unsqueeze", {keep, "const.axes12"}, "keep.b11t");  // (B, 1, 1, T)

  for (int64_t l = 0; l < cfg.n_layer; ++l) x = blocks.block(x, l, key_mask);

  // --- final LayerNorm, the mean over the real positions, the head
  const std::string h = blocks.layernorm(x, "ln_f");
  const std::string weight = g.op("Cast", {keep}, "keep.f32", {attr_int("to", onnx::TensorProto::FLOAT)});  // (B, T)
  const std::string weight3 = g.op("Unsqueeze", {weight, "const.two"}, "keep.bt1");                        // (B, T, 1)
  const std::string kept = g.op("Mul", {h, weight3}, "pool.kept");
  const std::string sum = g.op("ReduceSum", {kept, "const.one_i64"}, "pool.sum", {attr_int("keepdims", 0)});  // (B, C)
  const std::string count =
      g.op("ReduceSum", {weight, "const.one_i64"}, "pool.count", {attr_int("keepdims", 1)});  // (B, 1)
  const std::string pooled = g.op("Div", {sum, count}, "pooled");
  g.op("Gemm", {pooled, blocks.param("head.weight"), blocks.param("head.bias")}, kOutputName,
       {attr_int("transB", 1)});

  return {g.nodes(), g.initializers(), blocks.parameters()};
}

}  // namespace brisk::exporter
