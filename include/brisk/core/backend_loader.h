// Finds the optional CUDA backend at run time. The CUDA kernels live in their
// own shared library (libbrisk_cuda.so) that core never links: core only
// dlopen()s it. A binary built on or for a CPU-only machine therefore runs
// unchanged, and asking for the GPU answers "no, because ..." instead of
// failing to start for want of libcudart.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "brisk/core/backend.h"

namespace brisk::core {

// Loads libbrisk_cuda.so and creates its backend on device 0. Returns nullptr
// when the backend is unavailable and, if `why_not` is given, says why: not
// built, library not found (with every path tried), no GPU (with what the
// CUDA runtime returned), or a mismatch between the library and this binary.
// Search order: $BRISK_CUDA_LIBRARY, the path the build put it at, the
// running executable's directory (and ../lib), then the loader's default path.
std::unique_ptr<Backend> load_cuda_backend(std::string* why_not = nullptr);

// ---- the contract between the loader and the library -----------------------
// The library exports these two C symbols. The factory returns nullptr and
// writes a reason (NUL-terminated, truncated to `why_not_size`) when it cannot
// create a backend; it never throws across the boundary.
inline constexpr const char* kCudaFactorySymbol = "brisk_create_cuda_backend";
inline constexpr const char* kCudaAbiSymbol = "brisk_cuda_backend_abi";
using CudaBackendFactory = Backend* (*)(int device_index, char* why_not, size_t why_not_size);
using CudaBackendAbiFn = size_t (*)();

// Both sides compile this from the same headers; a stale library built
// against other headers (different op table, different layouts) disagrees
// and is refused rather than crashing on first use.
// kBackendInterface counts changes to the Backend class's virtual functions.
inline constexpr size_t kBackendInterface = 2;
constexpr size_t backend_abi_tag() {
  return kBackendInterface * 1299709u + size_t(kNumOps) * 1000003u + size_t(kNumDTypes) * 10007u + sizeof(ExecContext) * 101u +
         sizeof(KernelCall) * 7u + sizeof(TensorView) + sizeof(OpParams) * 13u;
}

}  // namespace brisk::core
