// The encoder-bodied models as ONNX graphs (opset 17): models::Encoder (the
// classifier) whole, and the encoder half of models::SeqAutoencoder (a
// sequence to its latent), spelled in standard ONNX ops (onnx_encoder.cpp).
#pragma once

#include <cstdint>

#include "brisk/models/encoder.h"
#include "brisk/models/seq_autoencoder.h"
#include "onnx.pb.h"
#include "onnx_graph.h"

namespace brisk::exporter {

inline constexpr const char* kLatentName = "latent";

// Fill `graph` (empty) with inputs input_ids and attention_mask (both int64
// (batch, seq)), one output, nodes and initializers. The classifier's output
// is logits (batch, n_classes); the autoencoder's is latent (batch, latent),
// what `brisk encode` writes (the decoder is not part of it).
GraphStats build_encoder_graph(const models::Encoder& model, onnx::GraphProto& graph);
GraphStats build_autoencoder_encoder_graph(const models::SeqAutoencoder& model, onnx::GraphProto& graph);

}  // namespace brisk::exporter
