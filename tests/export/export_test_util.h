// What the export tests share: the scripts next to them, the npm modules
// they run, a child process with a watchdog, random parameters and raw files.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../common/random_params.h"
#include "../integration/integration_util.h"
#include "brisk/core/tensor.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/train/checkpoint.h"

namespace brisk::export_test {

// The exported model of the tests: vocab 256, 2 layers, 64 wide, 2 heads, block 64.
inline const models::GptConfig kSmallGpt{256, 2, 64, 2, 64};

inline std::string script(const char* name) { return std::string(BRISK_EXPORT_TEST_DIR) + "/" + name; }

inline std::string npm_modules() {
  const char* env = std::getenv("BRISK_NPM_MODULES");
  return env && *env ? env : BRISK_NPM_MODULES;
}

// Where node-llama-cpp is (scripts/fetch_data.sh keeps it apart from the
// other npm packages: its install must not run scripts).
inline std::string llama_npm_modules() {
  const char* env = std::getenv("BRISK_LLAMA_NPM_MODULES");
  return env && *env ? env : BRISK_LLAMA_NPM_MODULES;
}

struct ProgramResult {
  int exit_code = -1;  // 127: the program could not be started
  std::string output;  // stdout and stderr together
};

// Runs argv[0] (looked up in PATH) with a watchdog, capturing its output.
inline ProgramResult run_program(const std::vector<std::string>& argv, double timeout_s = 120) {
  ProgramResult r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      r.output += "\n[killed after " + std::to_string(timeout_s) + " s]";
      break;
    }
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t k = ::read(fds[0], buf, sizeof buf);
    if (k <= 0) break;
    r.output.append(buf, size_t(k));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

using testing::randomize;  // every parameter random (../common/random_params.h)

inline void write_bytes(const std::string& path, const void* data, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(data, 1, n, f), n) << path;
  std::fclose(f);
}

inline std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = itest::read_text(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// A GPT of `config` with random values in every parameter, saved as a
// checkpoint of `run_dir` at `step` with the bytes tokenizer; returns its
// directory.
inline std::string save_random_checkpoint(const std::string& run_dir, const models::GptConfig& config, uint64_t seed,
                                          int64_t step, float linear_std = 0.1f) {
  cpu::CpuBackend backend(2);
  models::Gpt model(config, backend);
  model.init_weights(11);
  randomize(model, seed, linear_std);
  train::TrainState st;
  st.step = step;
  st.tokenizer = "bytes";
  return train::save_checkpoint(run_dir, model, nullptr, st, 0);
}

}  // namespace brisk::export_test
