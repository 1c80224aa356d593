// The run-time loader of the CUDA backend (see backend_loader.h). Only dlopen:
// linking libcudart here would make every binary need the CUDA runtime.
//
// The library is never dlclose()d. The backend object's vtable and its kernel
// function pointers live in the library, and kernels may have been copied
// into executors and caches that outlive the unique_ptr; keeping the mapping
// for the life of the process is the only safe choice and costs nothing.
#include "brisk/core/backend_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
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

}  // namespace

std::unique_ptr<Backend> load_cuda_backend(std::string* why_not) {
  std::string tried;
  void* lib = nullptr;
  std::string loaded_from;
  for (const std::string& path : candidates()) {
    if (!path.empty() && !std::filesystem::exists(path)) {
      tried += "\n  " + path + ": no such file";
      continue;
    }
    lib = dlopen(path.empty() ? kLibraryName : path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      loaded_from = path.empty() ? kLibraryName : path;
      break;
    }
    const char* err = dlerror();
    tried += "\n  " + (path.empty() ? std::string(kLibraryName) + " (default search path)" : path) + ": " +
             (err ? err : "dlopen failed");
  }
  if (!lib) {
    set_reason(why_not, std::string(kBuiltPath ? "CUDA backend library not found or not loadable; tried:"
                                               : "CUDA backend not built (configure with -DBRISK_CUDA=ON); "
                                                 "no libbrisk_cuda.so found either; tried:") +
                            tried);
    return nullptr;
  }

  auto abi = reinterpret_cast<CudaBackendAbiFn>(dlsym(lib, kCudaAbiSymbol));
  auto factory = reinterpret_cast<CudaBackendFactory>(dlsym(lib, kCudaFactorySymbol));
  if (!abi || !factory) {
    set_reason(why_not, loaded_from + " does not export " + kCudaAbiSymbol + " and " + kCudaFactorySymbol +
                            ": not a brisk CUDA backend library");
    return nullptr;
  }
  if (abi() != backend_abi_tag()) {
    set_reason(why_not, loaded_from + " was built against other brisk headers than this binary (ABI tag " +
                            std::to_string(abi()) + ", expected " + std::to_string(backend_abi_tag()) +
                            "); rebuild it");
    return nullptr;
  }
  char reason[512] = {};
  Backend* backend = factory(0, reason, sizeof(reason));
  if (!backend) {
    set_reason(why_not, reason[0] ? std::string(reason) : loaded_from + ": backend creation failed");
    return nullptr;
  }
  return std::unique_ptr<Backend>(backend);
}

}  // namespace brisk::core
