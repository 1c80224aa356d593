// Collectives between the processes of one data-parallel run. The engines
// are the ones clusters already have: Open MPI for CPU processes
// (src/dist/mpi_communicator.cpp) and NCCL for GPUs
// (src/backends/cuda/nccl_communicator.cpp, bootstrapped over MPI). brisk has
// no transport of its own.
//
// Every call is a blocking collective: all ranks call it in the same order
// with the same sizes. Buffers live where the communicator works (host memory
// for MPI, device memory for NCCL); broadcast_host always takes host bytes.
// Overlap with compute comes from dist::CommThread, which runs these calls
// on a thread of their own.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace brisk::core {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "nccl"

  // data[i] = sum over ranks of data[i], in place.
  virtual void allreduce_sum(float* data, size_t n) = 0;
  // data holds size() chunks of n floats; afterwards chunk rank() holds the
  // sum over ranks of that chunk (the other chunks are undefined).
  virtual void reduce_scatter_sum(float* data, size_t n) = 0;
  // data holds size() chunks of n floats; afterwards every chunk holds what
  // its owner rank had in it.
  virtual void allgather(float* data, size_t n) = 0;
  virtual void broadcast_host(void* data, size_t bytes, int root) = 0;
  // Host values reduced in place: sum (losses, counters) or max (stop flags).
  enum class Reduce { sum, max };
  virtual void allreduce_host(double* data, size_t n, Reduce op) = 0;
  virtual void barrier() = 0;
  // Ends every process of the job with exit_code. For an error one rank met
  // alone: the others would wait for it in their next collective until
  // their timeout, and this rank's MPI_Finalize would wait for them. The
  // default ends this process only.
  [[noreturn]] virtual void abort(int exit_code) {
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }
};

}  // namespace brisk::core
