// The GPT of models::Gpt as an ONNX graph (opset 17): what each block of
// src/models/gpt.cpp computes, spelled in standard ONNX ops (onnx_gpt.cpp).
#pragma once

#include <cstdint>

#include "brisk/models/gpt.h"
#include "onnx.pb.h"

namespace brisk::exporter {

inline constexpr const char* kInputName = "input_ids";
inline constexpr const char* kOutputName = "logits";

struct GptGraphStats {
  int64_t nodes = 0;
  int64_t initializers = 0;
  int64_t parameters = 0;  // weight elements from the model (constants not counted)
};

// Fills `graph` (empty) with inputs, outputs, nodes and initializers.
GptGraphStats build_gpt_graph(const models::Gpt& model, onnx::GraphProto& graph);

}  // namespace brisk::exporter
