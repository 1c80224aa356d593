// The GPT of models::Gpt as an ONNX graph (opset 17): what each block of
// src/models/gpt.cpp computes, spelled in standard ONNX ops (onnx_gpt.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "brisk/models/gpt.h"
#include "onnx.pb.h"
#include "onnx_blocks.h"

namespace brisk::exporter {

// The KV-cache variant's other inputs, with Hugging Face Optimum's names
// for GPT-2: attention_mask (batch, past + seq) and position_ids (batch,
// seq) int64, beside each layer's past keys and values (onnx_blocks.h).
inline constexpr const char* kPositionsName = "position_ids";

// Fills `graph` (empty) with inputs, outputs, nodes and initializers. With
// `kv_cache` the graph also takes every layer's cached keys and values of the
// positions before input_ids and returns them extended by input_ids' own.
GraphStats build_gpt_graph(const models::Gpt& model, onnx::GraphProto& graph, bool kv_cache = false);

}  // namespace brisk::exporter
