// Registration entry points of the CPU kernel files, one per op family. Each
// file registers its kernels for the (op, dtype) pairs it implements.
#pragma once

#include "brisk/core/backend.h"

namespace brisk::cpu {

void register_elementwise_kernels(core::KernelRegistry& r);
void register_activation_kernels(core::KernelRegistry& r);
void register_matmul_kernels(core::KernelRegistry& r);
void register_layernorm_kernels(core::KernelRegistry& r);
void register_softmax_kernels(core::KernelRegistry& r);
void register_attention_kernels(core::KernelRegistry& r);
void register_flash_attention_kernels(core::KernelRegistry& r);
void register_embedding_kernels(core::KernelRegistry& r);
void register_cross_entropy_kernels(core::KernelRegistry& r);
void register_reduce_kernels(core::KernelRegistry& r);
void register_shape_kernels(core::KernelRegistry& r);
void register_memory_kernels(core::KernelRegistry& r);
void register_optim_kernels(core::KernelRegistry& r);
void register_fused_classifier_kernels(core::KernelRegistry& r);
void register_linear_gelu_kernels(core::KernelRegistry& r);
void register_linear_param_grad_kernels(core::KernelRegistry& r);
void register_add_layernorm_kernels(core::KernelRegistry& r);
void register_quant_linear_kernels(core::KernelRegistry& r);
void register_linear_packed_kernels(core::KernelRegistry& r);
void register_linear_q8_packed_kernels(core::KernelRegistry& r);
void register_kv_attention_kernels(core::KernelRegistry& r);
void register_masked_attention_kernels(core::KernelRegistry& r);
void register_masked_flash_attention_kernels(core::KernelRegistry& r);
void register_masked_mean_kernels(core::KernelRegistry& r);
void register_dropout_kernels(core::KernelRegistry& r);

}  // namespace brisk::cpu
