// The Open MPI communicator (launch.h, core/communicator.h). Without MPI at
// build time connect_mpi() says so; the rest of brisk builds either way.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "brisk/core/error.h"
#include "brisk/dist/launch.h"

#ifdef BRISK_HAVE_MPI
// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace brisk::dist {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end && *end == 0 && x >= 0 && x < (1L << 30)) ? int(x) : fallback;
}
}  // namespace

Launch detect_launch() {
  Launch l;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {  // mpirun / mpiexec (Open MPI)
    l.launched = true;
    l.launcher = "mpirun";
    l.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    l.size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    l.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  } else if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK")) {  // srun --mpi=pmix / pmi2, other launchers
    l.launched = true;
    l.launcher = std::getenv("SLURM_PROCID") ? "slurm" : "pmi";
    l.rank = env_int(std::getenv("PMIX_RANK") ? "PMIX_RANK" : "PMI_RANK", 0);
    l.size = env_int("SLURM_NTASKS", env_int("PMI_SIZE", 1));
    l.local_rank = env_int("SLURM_LOCALID", env_int("MPI_LOCALRANKID", 0));
    l.local_size = env_int("SLURM_NTASKS_PER_NODE", env_int("MPI_LOCALNRANKS", 1));
  }
  return l;
}

#ifdef BRISK_HAVE_MPI

bool mpi_available() { return true; }

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw core::Error(std::string("MPI ") + what + " failed: " + std::string(msg, size_t(len)));
}

int as_count(size_t n, const char* what) {
  if (n > size_t(std::numeric_limits<int>::max()))
    throw core::Error(std::string("MPI ") + what + ": " + std::to_string(n) + " elements exceed one call's int count");
  return int(n);
}

class MpiCommunicator final : public core::Communicator {
 public:
  MpiCommunicator() {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw core::ConfigError("this MPI library does not allow calls from a thread other than main "
                              "(MPI_THREAD_SERIALIZED); brisk's communication thread needs it");
    }
    // Errors come back as codes (and become exceptions) instead of aborting the job silently.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void allreduce_sum(float* data, size_t n) override {
    // In pieces of at most 2^30 floats: MPI counts are ints.
    constexpr size_t kPiece = size_t(1) << 30;
    for (size_t off = 0; off < n; off += kPiece)
      check(MPI_Allreduce(MPI_IN_PLACE, data + off, int(std::min(kPiece, n - off)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "Allreduce");
  }
  void reduce_scatter_sum(float* data, size_t n) override {
    // In place, MPI leaves this rank's sum at the start of the buffer.
    check(MPI_Reduce_scatter_block(MPI_IN_PLACE, data, as_count(n, "Reduce_scatter_block"), MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD),
          "Reduce_scatter_block");
    if (rank_ != 0) std::memmove(data + size_t(rank_) * n, data, n * sizeof(float));
  }
  void allgather(float* data, size_t n) override {
    check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, as_count(n, "Allgather"), MPI_FLOAT, MPI_COMM_WORLD),
          "Allgather");
  }
  void broadcast_host(void* data, size_t bytes, int root) override {
    // In pieces of at most 1 GiB: MPI counts are ints, and the start-up
    // weight broadcast of a model past ~537M fp32 parameters is larger.
    constexpr size_t kPiece = size_t(1) << 30;
    for (size_t off = 0; off < bytes; off += kPiece)
      check(MPI_Bcast(static_cast<char*>(data) + off, int(std::min(kPiece, bytes - off)), MPI_BYTE, root,
                      MPI_COMM_WORLD),
            "Bcast");
  }
  void allreduce_host(double* data, size_t n, Reduce op) override {
    check(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n, "Allreduce"), MPI_DOUBLE, op == Reduce::sum ? MPI_SUM : MPI_MAX,
                        MPI_COMM_WORLD),
          "Allreduce");
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "Barrier"); }
  [[noreturn]] void abort(int exit_code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort returned: end this process at least
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<core::Communicator> connect_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) throw core::Error("connect_mpi: MPI is initialised already (one communicator per process)");
  return std::make_unique<MpiCommunicator>();
}

#else

bool mpi_available() { return false; }

std::unique_ptr<core::Communicator> connect_mpi() {
  throw core::ConfigError("this process was started by an MPI launcher, but brisk was built without MPI: install "
                          "libopenmpi-dev (scripts/install_deps.sh does) and rebuild");
}

#endif

}  // namespace brisk::dist
