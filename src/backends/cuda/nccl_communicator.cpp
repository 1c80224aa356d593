// The NCCL communicator: core::Communicator over NCCL for device buffers,
// with the host collectives (broadcast_host, allreduce_host, barrier) handed
// to the bootstrap communicator (MPI) that also carried NCCL's unique id.
// The engine reaches it only through core::load_nccl_communicator, which
// finds the two extern "C" entry points at the bottom of this file.
//
// Each communicator has a stream of its own on its device; every call
// enqueues on it and waits for it before returning, so the calls are
// blocking as the interface says. The caller makes sure the buffers are
// ready (the CUDA backend's copies and synchronize() wait for its stream).
// Calls may come from a thread other than the creating one
// (dist::CommThread), so each call selects the device first.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "brisk/core/backend_loader.h"
#include "brisk/core/communicator.h"
#include "brisk/core/error.h"

static_assert(NCCL_UNIQUE_ID_BYTES == brisk::core::kNcclUniqueIdBytes,
              "kNcclUniqueIdBytes in backend_loader.h must equal NCCL_UNIQUE_ID_BYTES");
static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES);

namespace brisk::cuda {
namespace {

std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

[[noreturn]] void throw_cuda(cudaError_t err, const char* what) {
  throw core::Error(std::string("nccl communicator: ") + what + " failed: " + cuda_error_text(err));
}

// NCCL's error string plus, when there is a communicator, its last error
// message (which names the cause: a peer gone, a bad argument, ...).
std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last && *last) text += ": " + std::string(last);
  return text;
}

class NcclCommunicator final : public core::Communicator {
 public:
  // Joins the communicator of `size` ranks named by `id` as `rank`, on CUDA
  // device `device`. Throws core::Error naming the failing call.
  NcclCommunicator(int rank, int size, const ncclUniqueId& id, int device, core::Communicator* bootstrap)
      : rank_(rank), size_(size), device_(device), bootstrap_(bootstrap) {
    if (const cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) throw_cuda(err, "cudaSetDevice");
    if (const cudaError_t err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); err != cudaSuccess)
      throw_cuda(err, "cudaStreamCreateWithFlags");
    ncclUniqueId id_copy = id;
    if (const ncclResult_t r = ncclCommInitRank(&comm_, size_, id_copy, rank_); r != ncclSuccess) {
      if (comm_) (void)ncclCommAbort(comm_);
      (void)cudaStreamDestroy(stream_);
      throw core::Error("nccl: ncclCommInitRank(rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                        ", device " + std::to_string(device_) + ") failed: " + nccl_error_text(r, nullptr));
    }
  }

  ~NcclCommunicator() override {
    (void)cudaSetDevice(device_);
    if (comm_) {
      // After a failure the peers may be gone or stuck: abort does not wait for them.
      if (failed_) {
        (void)ncclCommAbort(comm_);
      } else if (ncclCommDestroy(comm_) != ncclSuccess) {
        (void)ncclCommAbort(comm_);
      }
    }
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void allreduce_sum(float* data, size_t n) override {
    if (n == 0) return;
    run("ncclAllReduce", ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_prepared()));
  }

  // In place: NCCL allows recvbuff == sendbuff + rank * recvcount.
  void reduce_scatter_sum(float* data, size_t n) override {
    if (n == 0) return;
    run("ncclReduceScatter",
        ncclReduceScatter(data, data + size_t(rank_) * n, n, ncclFloat32, ncclSum, comm_, stream_prepared()));
  }

  // In place: NCCL allows sendbuff == recvbuff + rank * sendcount.
  void allgather(float* data, size_t n) override {
    if (n == 0) return;
    run("ncclAllGather", ncclAllGather(data + size_t(rank_) * n, data, n, ncclFloat32, comm_, stream_prepared()));
  }

  void broadcast_host(void* data, size_t bytes, int root) override { bootstrap_->broadcast_host(data, bytes, root); }
  void allreduce_host(double* data, size_t n, Reduce op) override { bootstrap_->allreduce_host(data, n, op); }
  void barrier() override { bootstrap_->barrier(); }

 private:
  // Selects the device on the calling thread; returns the stream to enqueue on.
  cudaStream_t stream_prepared() {
    if (failed_) throw core::Error("nccl: communicator unusable after an earlier failure");
    if (const cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      failed_ = true;
      throw_cuda(err, "cudaSetDevice");
    }
    return stream_;
  }

  // Checks the enqueue's result, then waits for the stream. The wait polls
  // instead of cudaStreamSynchronize so that an asynchronous NCCL error (a
  // peer died, a network failure) ends it with an error instead of a hang.
  void run(const char* what, ncclResult_t enqueued) {
    if (enqueued != ncclSuccess) fail(what, enqueued);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        failed_ = true;
        throw core::Error(std::string("nccl: ") + what + ": waiting for the stream failed: " + cuda_error_text(q));
      }
      ncclResult_t async = ncclSuccess;
      if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &async); r != ncclSuccess) fail(what, r);
      if (async != ncclSuccess && async != ncclInProgress) fail(what, async);
      std::this_thread::yield();
    }
  }

  [[noreturn]] void fail(const char* what, ncclResult_t r) {
    failed_ = true;
    throw core::Error(std::string("nccl: ") + what + " (rank " + std::to_string(rank_) + " of " +
                      std::to_string(size_) + ") failed: " + nccl_error_text(r, comm_));
  }

  int rank_, size_, device_;
  core::Communicator* bootstrap_;  // not owned; outlives this object
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool failed_ = false;
};

void write_reason(char* buf, size_t size, const std::string& s) {
  if (!buf || size == 0) return;
  std::snprintf(buf, size, "%s", s.c_str());
}

// Empty when device `device_index` exists, else why not.
std::string device_problem(int device_index) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return "no GPU: cudaGetDeviceCount returned " + cuda_error_text(err) + ", " + std::to_string(count) +
           " device(s)";
  }
  if (device_index < 0 || device_index >= count)
    return "no CUDA device " + std::to_string(device_index) + ": " + std::to_string(count) + " present";
  return {};
}

}  // namespace
}  // namespace brisk::cuda

// ---- the library's exported entry points (see backend_loader.h) --------------------

extern "C" __attribute__((visibility("default"))) int brisk_nccl_unique_id(char* out, size_t out_size,
                                                                           char* why_not, size_t why_not_size) {
  using brisk::cuda::write_reason;
  if (!out || out_size < sizeof(ncclUniqueId)) {
    write_reason(why_not, why_not_size,
                 "brisk_nccl_unique_id: output buffer of " + std::to_string(out_size) + " bytes, need " +
                     std::to_string(sizeof(ncclUniqueId)));
    return 1;
  }
  try {
    if (std::string problem = brisk::cuda::device_problem(0); !problem.empty()) {
      write_reason(why_not, why_not_size, "no NCCL unique id: " + problem);
      return 1;
    }
    ncclUniqueId id;
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      write_reason(why_not, why_not_size,
                   std::string("nccl: ncclGetUniqueId failed: ") + brisk::cuda::nccl_error_text(r, nullptr));
      return 1;
    }
    std::memcpy(out, &id, sizeof(id));
    return 0;
  } catch (const std::exception& e) {
    write_reason(why_not, why_not_size, std::string("no NCCL unique id: ") + e.what());
  } catch (...) {
    write_reason(why_not, why_not_size, "no NCCL unique id: unknown exception");
  }
  return 1;
}

extern "C" __attribute__((visibility("default"))) brisk::core::Communicator* brisk_create_nccl_communicator(
    int rank, int size, const char* unique_id, size_t id_size, int device_index,
    brisk::core::Communicator* bootstrap, char* why_not, size_t why_not_size) {
  using brisk::cuda::write_reason;
  if (!unique_id || id_size != sizeof(ncclUniqueId)) {
    write_reason(why_not, why_not_size,
                 "brisk_create_nccl_communicator: unique id of " + std::to_string(id_size) + " bytes, need " +
                     std::to_string(sizeof(ncclUniqueId)));
    return nullptr;
  }
  if (!bootstrap) {
    write_reason(why_not, why_not_size, "brisk_create_nccl_communicator: no bootstrap communicator");
    return nullptr;
  }
  if (size < 1 || rank < 0 || rank >= size) {
    write_reason(why_not, why_not_size,
                 "brisk_create_nccl_communicator: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                     " is not a rank");
    return nullptr;
  }
  try {
    if (std::string problem = brisk::cuda::device_problem(device_index); !problem.empty()) {
      write_reason(why_not, why_not_size, "no NCCL communicator: " + problem);
      return nullptr;
    }
    ncclUniqueId id;
    std::memcpy(&id, unique_id, sizeof(id));
    return new brisk::cuda::NcclCommunicator(rank, size, id, device_index, bootstrap);
  } catch (const std::exception& e) {
    write_reason(why_not, why_not_size, std::string("NCCL communicator set-up failed: ") + e.what());
  } catch (...) {
    write_reason(why_not, why_not_size, "NCCL communicator set-up failed with an unknown exception");
  }
  return nullptr;
}
