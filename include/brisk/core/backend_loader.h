// Finds the optional CUDA backend at run time. The CUDA kernels live in their
// own shared library (libbrisk_cuda.so) that core never links: core only
// dlopen()s it. A binary built on or for a CPU-only machine therefore runs
// unchanged, and asking for the GPU answers "no, because ..." instead of
// failing to start for want of libcudart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "brisk/core/backend.h"
#include "brisk/core/communicator.h"

namespace brisk::core {

// Loads libbrisk_cuda.so and creates its backend on CUDA device
// `device_index` (a process of a multi-GPU run passes its local rank).
// Returns nullptr when the backend is unavailable and, if `why_not` is given,
// says why: not built, library not found (with every path tried), no GPU or
// no such device (with what the CUDA runtime returned), or a mismatch between
// the library and this binary.
// Search order: $BRISK_CUDA_LIBRARY, the path the build put it at, the
// running executable's directory (and ../lib), then the loader's default path.
std::unique_ptr<Backend> load_cuda_backend(std::string* why_not = nullptr, int device_index = 0);

// Creates the NCCL communicator of libbrisk_cuda.so (found as above) on CUDA
// device `device_index`, for the ranks of `bootstrap` (the MPI communicator:
// rank(), size(), and the host collectives that the NCCL communicator
// delegates to it; it must outlive the result). A collective: every rank of
// `bootstrap` calls it with its own device. Rank 0 makes the NCCL unique id
// and broadcasts it over `bootstrap` (an NcclIdMessage, below), then every
// rank joins the NCCL communicator. Returns nullptr and, if `why_not` is
// given, says why on every rank when any rank cannot load the library or
// rank 0 cannot make the id; never throws. A rank that fails inside NCCL's
// own set-up (ncclCommInitRank) is left to NCCL's error handling.
std::unique_ptr<Communicator> load_nccl_communicator(Communicator& bootstrap, int device_index,
                                                     std::string* why_not = nullptr);

// ---- the contract between the loader and the library -----------------------
// The library exports these C symbols. The factory returns nullptr and
// writes a reason (NUL-terminated, truncated to `why_not_size`) when it cannot
// create a backend; it never throws across the boundary.
inline constexpr const char* kCudaFactorySymbol = "brisk_create_cuda_backend";
inline constexpr const char* kCudaAbiSymbol = "brisk_cuda_backend_abi";
using CudaBackendFactory = Backend* (*)(int device_index, char* why_not, size_t why_not_size);
using CudaBackendAbiFn = size_t (*)();

// NCCL (same library, same rules: nullptr or non-zero plus a reason, no
// exception across the boundary). brisk_nccl_unique_id writes the
// kNcclUniqueIdBytes bytes of a fresh ncclUniqueId to `out` (out_size must be
// at least that) and returns 0. The factory joins the communicator of `size`
// ranks named by that id as `rank`, on CUDA device `device_index`;
// `bootstrap` (not owned) serves the host collectives.
inline constexpr const char* kNcclUniqueIdSymbol = "brisk_nccl_unique_id";
inline constexpr const char* kNcclFactorySymbol = "brisk_create_nccl_communicator";
using NcclUniqueIdFn = int (*)(char* out, size_t out_size, char* why_not, size_t why_not_size);
using NcclCommunicatorFactory = Communicator* (*)(int rank, int size, const char* unique_id, size_t id_size,
                                                  int device_index, Communicator* bootstrap, char* why_not,
                                                  size_t why_not_size);
// NCCL_UNIQUE_ID_BYTES; the library static_asserts that they agree.
inline constexpr size_t kNcclUniqueIdBytes = 128;

// What rank 0 broadcasts over the bootstrap communicator in
// load_nccl_communicator, as raw bytes (every rank runs the same binary):
// ok = 1 and the id, or ok = 0 and why rank 0 could not make one.
struct NcclIdMessage {
  int32_t ok = 0;
  char id[kNcclUniqueIdBytes] = {};
  char reason[380] = {};  // NUL-terminated
};

// Both sides compile this from the same headers; a stale library built
// against other headers (different op table, different layouts) disagrees
// and is refused rather than crashing on first use.
// kBackendInterface counts changes to the Backend class's virtual functions
// and to the library's exported entry points (3: the NCCL communicator).
inline constexpr size_t kBackendInterface = 3;
constexpr size_t backend_abi_tag() {
  return kBackendInterface * 1299709u + size_t(kNumOps) * 1000003u + size_t(kNumDTypes) * 10007u + sizeof(ExecContext) * 101u +
         sizeof(KernelCall) * 7u + sizeof(TensorView) + sizeof(OpParams) * 13u;
}

}  // namespace brisk::core
