// The encoder classifier of models::Encoder as an ONNX graph (opset 17):
// what src/models/encoder.cpp computes, spelled in standard ONNX ops
// (onnx_encoder.cpp).
#pragma once

#include <cstdint>

#include "brisk/models/encoder.h"
#include "onnx.pb.h"
#include "onnx_graph.h"

namespace brisk::exporter {

// Fills `graph` (empty) with inputs input_ids and attention_mask (both int64
// (batch, seq)), output logits (batch, n_classes), nodes and initializers.
GraphStats build_encoder_graph(const models::Encoder& model, onnx::GraphProto& graph);

}  // namespace brisk::exporter
