// The NCCL communicator (src/backends/cuda/nccl_communicator.cpp) through
// core::load_nccl_communicator, bootstrapped by a one-rank host communicator
// written here. With one rank every collective must leave its data as it
// was, which still runs NCCL's set-up and the in-place forms of
// ncclAllReduce, ncclReduceScatter and ncclAllGather on device buffers from
// the CUDA backend's allocator; guard floats around each buffer catch writes
// out of bounds. The loader's failure paths (rank 0 cannot make the unique
// id; no such device) need no GPU and run everywhere. Where the CUDA backend
// cannot be loaded (not built, no GPU) the device tests skip with the
// loader's reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "brisk/core/backend_loader.h"
#include "brisk/core/communicator.h"

using namespace brisk;

namespace {

// A host-only communicator of one rank: the bootstrap that MPI is in a real
// run. It counts the calls delegated to it, and can play a rank 0 that
// failed to make the NCCL unique id (what every other rank then receives).
class SoloBootstrap final : public core::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "solo"; }
  void allreduce_sum(float*, size_t) override {}
  void reduce_scatter_sum(float*, size_t) override {}
  void allgather(float*, size_t) override {}
  void broadcast_host(void* data, size_t bytes, int root) override {
    ++broadcasts;
    last_root = root;
    if (!report_rank0_failure) return;
    if (bytes != sizeof(core::NcclIdMessage)) {
      ADD_FAILURE() << "broadcast of " << bytes << " bytes, expected an NcclIdMessage of "
                    << sizeof(core::NcclIdMessage);
      return;
    }
    core::NcclIdMessage failed;
    failed.ok = 0;
    std::snprintf(failed.reason, sizeof(failed.reason), "%s", kInjectedReason);
    std::memcpy(data, &failed, sizeof(failed));
  }
  void allreduce_host(double*, size_t, Reduce) override { ++host_allreduces; }
  void barrier() override { ++barriers; }

  static constexpr const char* kInjectedReason = "injected: rank 0 has no GPU";
  bool report_rank0_failure = false;
  int broadcasts = 0, host_allreduces = 0, barriers = 0, last_root = -1;
};

// ---- the loader, with or without a GPU ---------------------------------------------

// Rank 0's failure travels in the broadcast: every rank gets nullptr and a
// reason naming it, instead of waiting in ncclCommInitRank.
TEST(NcclCommunicatorLoader, Rank0FailureGivesEveryRankAReason) {
  SoloBootstrap boot;
  boot.report_rank0_failure = true;
  std::string why;
  std::unique_ptr<core::Communicator> comm;
  ASSERT_NO_THROW(comm = core::load_nccl_communicator(boot, 0, &why));
  EXPECT_EQ(comm, nullptr);
  EXPECT_FALSE(why.empty());
  if (boot.broadcasts == 0) {
    // The library itself could not be loaded: every rank stops before the broadcast.
    std::printf("[ info     ] libbrisk_cuda.so unavailable, stopped before the id broadcast: %s\n", why.c_str());
    return;
  }
  EXPECT_EQ(boot.broadcasts, 1);
  EXPECT_EQ(boot.last_root, 0);
  EXPECT_NE(why.find("rank 0"), std::string::npos) << why;
  EXPECT_NE(why.find(SoloBootstrap::kInjectedReason), std::string::npos) << why;
}

// Whatever the machine: a communicator, or a reason; never a throw.
TEST(NcclCommunicatorLoader, LoadsOrExplainsWhyNot) {
  SoloBootstrap boot;
  std::string why;
  std::unique_ptr<core::Communicator> comm;
  ASSERT_NO_THROW(comm = core::load_nccl_communicator(boot, 0, &why));
  if (comm) {
    EXPECT_EQ(comm->name(), "nccl");
  } else {
    EXPECT_FALSE(why.empty());
    std::printf("[ info     ] NCCL communicator unavailable (expected on CPU-only machines): %s\n", why.c_str());
  }
  std::unique_ptr<core::Communicator> quiet;
  EXPECT_NO_THROW(quiet = core::load_nccl_communicator(boot, 0));  // no reason pointer
}

// A device index past the last GPU is refused with a reason, by both loaders.
TEST(NcclCommunicatorLoader, MissingDeviceIsRefused) {
  constexpr int kNoSuchDevice = 1 << 20;
  std::string why;
  std::unique_ptr<core::Backend> backend;
  ASSERT_NO_THROW(backend = core::load_cuda_backend(&why, kNoSuchDevice));
  EXPECT_EQ(backend, nullptr);
  EXPECT_FALSE(why.empty());
  SoloBootstrap boot;
  why.clear();
  std::unique_ptr<core::Communicator> comm;
  ASSERT_NO_THROW(comm = core::load_nccl_communicator(boot, kNoSuchDevice, &why));
  EXPECT_EQ(comm, nullptr);
  EXPECT_FALSE(why.empty());
}

// ---- collectives on the device ---------------------------------------------------------

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  // One backend and one communicator for the suite: CUDA and NCCL set-up is slow.
  static void SetUpTestSuite() {
    backend_ = core::load_cuda_backend(&backend_reason_).release();
    if (backend_) {
      bootstrap_ = new SoloBootstrap;
      comm_ = core::load_nccl_communicator(*bootstrap_, 0, &comm_reason_).release();
    }
  }
  static void TearDownTestSuite() {
    delete comm_;
    comm_ = nullptr;
    delete bootstrap_;
    bootstrap_ = nullptr;
    delete backend_;
    backend_ = nullptr;
  }
  void SetUp() override {
    if (!backend_) GTEST_SKIP() << "no GPU to run NCCL on: CUDA backend unavailable: " << backend_reason_;
    // A GPU is there, so NCCL must work: not a skip.
    ASSERT_NE(comm_, nullptr) << "CUDA backend loaded but no NCCL communicator: " << comm_reason_;
  }

  enum class Collective { allreduce, reduce_scatter, allgather };

  // Runs `c` in place on n random non-zero floats (one chunk: one rank) in a
  // device buffer with guard floats on both sides; with one rank the data
  // must come back unchanged and the guards untouched.
  static void check_identity(Collective c, size_t n) {
    constexpr size_t kGuard = 64;
    constexpr float kSentinel = -12345.5f;
    std::mt19937 rng(static_cast<unsigned>(n) * 7919u + static_cast<unsigned>(c));
    std::uniform_real_distribution<float> mag(0.5f, 2.0f);
    std::bernoulli_distribution neg(0.5);
    std::vector<float> host(n + 2 * kGuard, kSentinel);
    for (size_t i = 0; i < n; ++i) host[kGuard + i] = neg(rng) ? -mag(rng) : mag(rng);

    const size_t bytes = host.size() * sizeof(float);
    core::Allocator& alloc = backend_->allocator();
    auto* dev = static_cast<float*>(alloc.allocate(bytes));
    ASSERT_NE(dev, nullptr);
    backend_->copy_to_device(dev, host.data(), bytes);
    float* data = dev + kGuard;
    switch (c) {
      case Collective::allreduce:
        ASSERT_NO_THROW(comm_->allreduce_sum(data, n));
        break;
      case Collective::reduce_scatter:
        ASSERT_NO_THROW(comm_->reduce_scatter_sum(data, n));
        break;
      case Collective::allgather:
        ASSERT_NO_THROW(comm_->allgather(data, n));
        break;
    }
    std::vector<float> back(host.size(), 0.0f);
    backend_->copy_to_host(back.data(), dev, bytes);
    alloc.deallocate(dev, bytes);

    size_t wrong = 0, first_wrong = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      if (std::memcmp(&back[i], &host[i], sizeof(float)) != 0 && wrong++ == 0) first_wrong = i;
    }
    EXPECT_EQ(wrong, 0u) << "n=" << n << ": " << wrong << " float(s) differ, first at buffer index " << first_wrong
                         << " (data starts at " << kGuard << "): got " << back[first_wrong] << ", expected "
                         << host[first_wrong];
  }

  static core::Backend* backend_;
  static SoloBootstrap* bootstrap_;
  static core::Communicator* comm_;
  static std::string backend_reason_, comm_reason_;
};

core::Backend* NcclCommunicatorTest::backend_ = nullptr;
SoloBootstrap* NcclCommunicatorTest::bootstrap_ = nullptr;
core::Communicator* NcclCommunicatorTest::comm_ = nullptr;
std::string NcclCommunicatorTest::backend_reason_;
std::string NcclCommunicatorTest::comm_reason_;

constexpr size_t kSizes[] = {1, 1000, 4097};

TEST_F(NcclCommunicatorTest, Identity) {
  EXPECT_EQ(comm_->name(), "nccl");
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
}

TEST_F(NcclCommunicatorTest, AllreduceSumInPlace) {
  for (size_t n : kSizes) check_identity(Collective::allreduce, n);
}

TEST_F(NcclCommunicatorTest, ReduceScatterSumInPlace) {
  for (size_t n : kSizes) check_identity(Collective::reduce_scatter, n);
}

TEST_F(NcclCommunicatorTest, AllgatherInPlace) {
  for (size_t n : kSizes) check_identity(Collective::allgather, n);
}

TEST_F(NcclCommunicatorTest, EmptyCallsAreNoOps) {
  EXPECT_NO_THROW(comm_->allreduce_sum(nullptr, 0));
  EXPECT_NO_THROW(comm_->reduce_scatter_sum(nullptr, 0));
  EXPECT_NO_THROW(comm_->allgather(nullptr, 0));
}

// Host collectives go to the bootstrap communicator.
TEST_F(NcclCommunicatorTest, HostCollectivesUseTheBootstrap) {
  const int broadcasts = bootstrap_->broadcasts, allreduces = bootstrap_->host_allreduces,
            barriers = bootstrap_->barriers;
  char bytes[16] = {};
  comm_->broadcast_host(bytes, sizeof(bytes), 0);
  double loss = 1.5;
  comm_->allreduce_host(&loss, 1, core::Communicator::Reduce::sum);
  comm_->barrier();
  EXPECT_EQ(bootstrap_->broadcasts, broadcasts + 1);
  EXPECT_EQ(bootstrap_->host_allreduces, allreduces + 1);
  EXPECT_EQ(bootstrap_->barriers, barriers + 1);
  EXPECT_EQ(loss, 1.5);
}

}  // namespace
