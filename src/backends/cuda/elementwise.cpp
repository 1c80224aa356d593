// Registration of the elementwise CUDA kernels (add, scale; f32 and bf16):
// unpacks a KernelCall and hands raw pointers to the launchers compiled by
// nvcc (elementwise_kernels.cu). Launch errors are checked right away so a
// bad launch names its op instead of surfacing at the next synchronisation.
#include "brisk/core/op.h"
#include "cuda_backend.h"
#include "elementwise_kernels.h"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

void add_f32(const KernelCall& c) {
  launch_add_f32(c.in(0).as<float>(), c.in(1).as<float>(), c.out(0).as<float>(), c.in(0).numel(),
                 c.in(1).numel(), stream_of(c));
  check_cuda(cudaGetLastError(), "add(f32) launch");
}

void add_bf16(const KernelCall& c) {
  launch_add_bf16(c.in(0).as<uint16_t>(), c.in(1).as<uint16_t>(), c.out(0).as<uint16_t>(), c.in(0).numel(),
                  c.in(1).numel(), stream_of(c));
  check_cuda(cudaGetLastError(), "add(bf16) launch");
}

void scale_f32(const KernelCall& c) {
  launch_scale_f32(c.in(0).as<float>(), c.out(0).as<float>(), c.p<ops::ScaleParams>().scale, c.in(0).numel(),
                   stream_of(c));
  check_cuda(cudaGetLastError(), "scale(f32) launch");
}

void scale_bf16(const KernelCall& c) {
  launch_scale_bf16(c.in(0).as<uint16_t>(), c.out(0).as<uint16_t>(), c.p<ops::ScaleParams>().scale,
                    c.in(0).numel(), stream_of(c));
  check_cuda(cudaGetLastError(), "scale(bf16) launch");
}

}  // namespace

void register_elementwise_kernels(core::KernelRegistry& r) {
  r.add(OpKind::add, DType::f32, add_f32);
  r.add(OpKind::add, DType::bf16, add_bf16);
  r.add(OpKind::scale, DType::f32, scale_f32);
  r.add(OpKind::scale, DType::bf16, scale_bf16);
}

}  // namespace brisk::cuda
