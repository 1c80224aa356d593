// The run-time loader of the CUDA backend and of its NCCL communicator (see
// backend_loader.h). Only dlopen: linking libcudart or libnccl here would
// make every binary need the CUDA runtime.
//
// The library is never dlclose()d. The backend object's vtable and its kernel
// function pointers live in the library, and kernels may have been copied
// into executors and caches that outlive the unique_ptr; keeping the mapping
// for the life of the process is the only safe choice and costs nothing.
#include "brisk/core/backend_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <vector>

namespace brisk::core {
namespace {

constexpr const char* kLibraryName = "libbrisk_cuda.so";

#ifdef BRISK_CUDA_LIBRARY_PATH
constexpr const char* kBuiltPath = BRISK_CUDA_LIBRARY_PATH;
#else
constexpr const char* kBuiltPath = nullptr;
#endif

std::filesystem::path executable_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path{} : exe.parent_path();
}

// Candidate paths in search order; empty string = the dynamic loader's default search.
std::vector<std::string> candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("BRISK_CUDA_LIBRARY"); env && *env) paths.emplace_back(env);
  if (kBuiltPath) paths.emplace_back(kBuiltPath);
  if (auto dir = executable_dir(); !dir.empty()) {
    paths.push_back((dir / kLibraryName).string());
    paths.push_back((dir / ".." / "lib" / kLibraryName).string());
  }
  paths.emplace_back();
  return paths;
}

void set_reason(std::string* why_not, std::string reason) {
  if (why_not) *why_not = std::move(reason);
}

// libbrisk_cuda.so, opened and checked against this binary's headers.
struct CudaLibrary {
  void* handle = nullptr;
  std::string path;  // where it was loaded from, for messages
};

// Opens the library (search order in backend_loader.h) and checks its ABI
// tag. On failure returns a null handle and says why.
CudaLibrary open_cuda_library(std::string* why_not) {
  std::string tried;
  CudaLibrary lib;
  for (const std::string& path : candidates()) {
    if (!path.empty() && !std::filesystem::exists(path)) {
      tried += "\n  " + path + ": no such file";
      continue;
    }
    lib.handle = dlopen(path.empty() ? kLibraryName : path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) {
      lib.path = path.empty() ? kLibraryName : path;
      break;
    }
    const char* err = dlerror();
    tried += "\n  " + (path.empty() ? std::string(kLibraryName) + " (default search path)" : path) + ": " +
             (err ? err : "dlopen failed");
  }
  if (!lib.handle) {
    set_reason(why_not, std::string(kBuiltPath ? "CUDA backend library not found or not loadable; tried:"
                                               : "CUDA backend not built (configure with -DBRISK_CUDA=ON); "
                                                 "no libbrisk_cuda.so found either; tried:") +
                            tried);
    return {};
  }
  auto abi = reinterpret_cast<CudaBackendAbiFn>(dlsym(lib.handle, kCudaAbiSymbol));
  if (!abi) {
    set_reason(why_not, lib.path + " does not export " + kCudaAbiSymbol + ": not a brisk CUDA backend library");
    return {};
  }
  if (abi() != backend_abi_tag()) {
    set_reason(why_not, lib.path + " was built against other brisk headers than this binary (ABI tag " +
                            std::to_string(abi()) + ", expected " + std::to_string(backend_abi_tag()) +
                            "); rebuild it");
    return {};
  }
  return lib;
}

// The symbol `name` of an opened library, or nullptr with a reason.
template <class Fn>
Fn find_symbol(const CudaLibrary& lib, const char* name, std::string* why_not) {
  auto fn = reinterpret_cast<Fn>(dlsym(lib.handle, name));
  if (!fn) set_reason(why_not, lib.path + " does not export " + name + ": not a brisk CUDA backend library");
  return fn;
}

}  // namespace

std::unique_ptr<Backend> load_cuda_backend(std::string* why_not, int device_index) {
  const CudaLibrary lib = open_cuda_library(why_not);
  if (!lib.handle) return nullptr;
  auto factory = find_symbol<CudaBackendFactory>(lib, kCudaFactorySymbol, why_not);
  if (!factory) return nullptr;
  char reason[512] = {};
  Backend* backend = factory(device_index, reason, sizeof(reason));
  if (!backend) {
    set_reason(why_not, reason[0] ? std::string(reason) : lib.path + ": backend creation failed");
    return nullptr;
  }
  return std::unique_ptr<Backend>(backend);
}

// Every step that can fail on some ranks is followed by a collective that
// tells all ranks, so that they all give up together instead of some waiting
// forever in the next collective: first the library (an allreduce of
// failures), then rank 0's unique id (the broadcast carries a status).
std::unique_ptr<Communicator> load_nccl_communicator(Communicator& bootstrap, int device_index,
                                                     std::string* why_not) {
  const int rank = bootstrap.rank();
  const int size = bootstrap.size();
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
  try {
    std::string local_reason;
    NcclUniqueIdFn make_id = nullptr;
    NcclCommunicatorFactory factory = nullptr;
    if (const CudaLibrary lib = open_cuda_library(&local_reason); lib.handle) {
      make_id = find_symbol<NcclUniqueIdFn>(lib, kNcclUniqueIdSymbol, &local_reason);
      factory = make_id ? find_symbol<NcclCommunicatorFactory>(lib, kNcclFactorySymbol, &local_reason) : nullptr;
    }
    double failed_ranks = factory ? 0.0 : 1.0;
    bootstrap.allreduce_host(&failed_ranks, 1, Communicator::Reduce::sum);
    if (!factory) {
      set_reason(why_not, who + "no NCCL communicator: " + local_reason);
      return nullptr;
    }
    if (failed_ranks > 0.0) {
      set_reason(why_not, who + "no NCCL communicator: " + std::to_string(static_cast<long>(failed_ranks)) +
                              " other rank(s) could not load the CUDA backend library (their logs say why)");
      return nullptr;
    }

    NcclIdMessage msg;
    if (rank == 0) {
      char reason[sizeof(msg.reason)] = {};
      if (make_id(msg.id, sizeof(msg.id), reason, sizeof(reason)) == 0) {
        msg.ok = 1;
      } else {
        msg.ok = 0;
        std::memcpy(msg.reason, reason, sizeof(reason));
        msg.reason[sizeof(msg.reason) - 1] = '\0';
        if (!msg.reason[0]) std::snprintf(msg.reason, sizeof(msg.reason), "%s failed", kNcclUniqueIdSymbol);
      }
    }
    bootstrap.broadcast_host(&msg, sizeof(msg), 0);
    if (msg.ok != 1) {
      msg.reason[sizeof(msg.reason) - 1] = '\0';
      set_reason(why_not, who + "no NCCL communicator: rank 0 could not make the NCCL unique id: " +
                              (msg.reason[0] ? std::string(msg.reason) : std::string("no reason given")));
      return nullptr;
    }

    char reason[512] = {};
    Communicator* comm = factory(rank, size, msg.id, sizeof(msg.id), device_index, &bootstrap, reason, sizeof(reason));
    if (!comm) {
      set_reason(why_not, who + (reason[0] ? std::string(reason) : std::string("NCCL communicator creation failed")));
      return nullptr;
    }
    return std::unique_ptr<Communicator>(comm);
  } catch (const std::exception& e) {
    set_reason(why_not, who + "no NCCL communicator: the bootstrap communicator failed: " + e.what());
  } catch (...) {
    set_reason(why_not, who + "no NCCL communicator: the bootstrap communicator failed with an unknown exception");
  }
  return nullptr;
}

}  // namespace brisk::core
