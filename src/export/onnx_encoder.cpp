// The encoder-bodied models as ONNX graphs (onnx_encoder.h): one graph, a
// pooled encoder, with the classifier's parameter names and head, or the
// autoencoder encoder's ("enc." before every body parameter, the to_latent
// Linear as the head). Shapes: B batch, T seq (both symbolic), C n_embd, K
// the head's width (n_classes, or latent).
//
//   input_ids, attention_mask (B, T) int64
//   keep = attention_mask != 0                                      (B, T)
//   x = Gather(wte, ids) + Slice(wpe, rows [0, T))                  (B, T, C)
//   n_layer blocks (onnx_blocks.cpp), every query attending to the keys
//   where keep is true: keep as (B, 1, 1, T)
//   h = LayerNormalization(x, ln_f)
//   pooled = sum over t of h * keep / sum over t of keep             (B, C)
//   out = Gemm(pooled, head.weight, head.bias, transB)               (B, K)
//
// brisk's encoders take right-padded rows and their lengths; a row whose
// attention_mask is 1 on its first `length` columns and 0 after is that
// row: attention masked at its padded keys, the mean over its real
// positions. Padded positions' own outputs are computed and dropped by the
// pooling, as brisk computes and drops them. The head's weight stays (K, C)
// as in model.safetensors (Gemm's transB reads it).
#include "onnx_encoder.h"

#include <string>

#include "onnx_blocks.h"
#include "onnx_graph.h"

namespace brisk::exporter {

namespace {

// What differs between the two models' graphs.
struct PooledEncoder {
  std::string graph_name;
  std::string prefix;  // before every body parameter: "" or "enc."
  std::string head;    // the Linear after the pooling: "head" or "to_latent"
  std::string output, output_doc;
  int64_t vocab_size, n_layer, n_embd, n_head, max_len, out_dim;
};

GraphStats build_pooled_encoder(const core::ParameterStore& params, const PooledEncoder& m, onnx::GraphProto& graph) {
  OnnxGraph g(graph);
  BlockWriter blocks(params, g, m.n_embd, m.n_head, false, m.prefix);
  graph.set_name(m.graph_name);

  const Dim batch{0, "batch"}, seq{0, "seq"};
  declare(graph.add_input(), kInputName, onnx::TensorProto::INT64, {batch, seq},
          "token ids in [0, " + std::to_string(m.vocab_size) + "), rows right-padded; seq at most " +
              std::to_string(m.max_len));
  declare(graph.add_input(), kAttentionMaskName, onnx::TensorProto::INT64, {batch, seq},
          "1 on a row's real tokens, 0 on its padding (after them); every row needs at least one 1");
  declare(graph.add_output(), m.output, onnx::TensorProto::FLOAT, {batch, Dim{m.out_dim, ""}}, m.output_doc);

  blocks.constants();
  g.i64("const.zero", {0});
  g.i64("const.one_i64", {1});
  g.i64("const.two", {2});
  g.i64("const.axes12", {1, 2});

  // --- embeddings; the seq length from input_ids' run-time shape
  const std::string shape = g.op("Shape", {kInputName}, "input_shape");                         // [B, T]
  const std::string seq_len = g.op("Slice", {shape, "const.one_i64", "const.two"}, "seq_len");  // [T]
  const std::string tok =
      g.op("Gather", {blocks.param(m.prefix + "wte.weight"), kInputName}, "tok_emb", {attr_int("axis", 0)});
  const std::string pos =
      g.op("Slice", {blocks.param(m.prefix + "wpe.weight"), "const.zero", seq_len, "const.zero"}, "pos_emb");
  std::string x = g.op("Add", {tok, pos}, "embed");

  // --- the key mask: every query sees the row's real keys
  const std::string keep = g.op("Cast", {kAttentionMaskName}, "keep", {attr_int("to", onnx::TensorProto::BOOL)});
  const std::string key_mask = g.op("Unsqueeze", {keep, "const.axes12"}, "keep.b11t");  // (B, 1, 1, T)

  for (int64_t l = 0; l < m.n_layer; ++l) x = blocks.block(x, l, key_mask);

  // --- final LayerNorm, the mean over the real positions, the head
  const std::string h = blocks.layernorm(x, m.prefix + "ln_f");
  const std::string weight = g.op("Cast", {keep}, "keep.f32", {attr_int("to", onnx::TensorProto::FLOAT)});  // (B, T)
  const std::string weight3 = g.op("Unsqueeze", {weight, "const.two"}, "keep.bt1");                        // (B, T, 1)
  const std::string kept = g.op("Mul", {h, weight3}, "pool.kept");
  const std::string sum = g.op("ReduceSum", {kept, "const.one_i64"}, "pool.sum", {attr_int("keepdims", 0)});  // (B, C)
  const std::string count =
      g.op("ReduceSum", {weight, "const.one_i64"}, "pool.count", {attr_int("keepdims", 1)});  // (B, 1)
  const std::string pooled = g.op("Div", {sum, count}, "pooled");
  g.op("Gemm", {pooled, blocks.param(m.head + ".weight"), blocks.param(m.head + ".bias")}, m.output,
       {attr_int("transB", 1)});

  return {g.nodes(), g.initializers(), blocks.parameters()};
}

}  // namespace

GraphStats build_encoder_graph(const models::Encoder& model, onnx::GraphProto& graph) {
  const models::EncoderConfig& c = model.config();
  return build_pooled_encoder(
      model.params(),
      {"brisk_encoder_classifier", "", "head", kOutputName,
       "class logits of each row (softmax gives the probabilities brisk classify prints)", c.vocab_size, c.n_layer,
       c.n_embd, c.n_head, c.max_len, c.n_classes},
      graph);
}

GraphStats build_autoencoder_encoder_graph(const models::SeqAutoencoder& model, onnx::GraphProto& graph) {
  const models::SeqAutoencoderConfig& c = model.config();
  return build_pooled_encoder(model.params(),
                              {"brisk_seq_autoencoder_encoder", "enc.", "to_latent", kLatentName,
                               "each row's latent vector, as brisk encode writes it", c.vocab_size, c.n_layer,
                               c.n_embd, c.n_head, c.max_len, c.latent},
                              graph);
}

}  // namespace brisk::exporter
