// CPU backend: collects the kernel files' registrations and sets the thread
// count for OpenMP and OpenBLAS together.
#include "brisk/cpu/cpu_backend.h"

#include <omp.h>

#include <cstring>
#include <thread>

#include "gemm.h"
#include "kernels.h"

extern "C" void openblas_set_num_threads(int);

namespace brisk::cpu {

// Matrix products are split across our own OpenMP team (see matmul.cpp), so
// only one pool ever runs on the cores. The OpenMP build of OpenBLAS sets the
// OpenMP thread count itself, so it is told first and ours is set last.
void set_num_threads(int n) {
  openblas_set_num_threads(1);
  omp_set_num_threads(n);
}

CpuBackend::CpuBackend(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads : int(std::max(1u, std::thread::hardware_concurrency()))),
      gemm_cache_(make_gemm_cache()) {
  set_num_threads(num_threads_);
  auto& r = kernels();
  register_elementwise_kernels(r);
  register_activation_kernels(r);
  register_matmul_kernels(r);
  register_layernorm_kernels(r);
  register_softmax_kernels(r);
  register_attention_kernels(r);
  register_flash_attention_kernels(r);
  register_embedding_kernels(r);
  register_cross_entropy_kernels(r);
  register_reduce_kernels(r);
  register_shape_kernels(r);
  register_memory_kernels(r);
  register_optim_kernels(r);
  register_fused_classifier_kernels(r);
  register_linear_gelu_kernels(r);
  register_linear_param_grad_kernels(r);
  register_add_layernorm_kernels(r);
  register_quant_linear_kernels(r);
  register_linear_packed_kernels(r);
  register_linear_q8_packed_kernels(r);
  register_kv_attention_kernels(r);
  register_masked_attention_kernels(r);
  register_masked_flash_attention_kernels(r);
  register_masked_mean_kernels(r);
  register_dropout_kernels(r);
}

void CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

}  // namespace brisk::cpu
