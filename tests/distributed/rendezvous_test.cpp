// The launch environment (torchrun / Slurm conventions) and the TCP rendezvous that carries NCCL's unique id,
// exercised in one process: the "ranks" are threads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distributed_test_util.h"
#include "microllm/distributed/communicator.h"

namespace microllm::distributed {
namespace {

// Sets environment variables for its scope and restores the previous values.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, const char*>> values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
      if (value != nullptr) {
        ::setenv(name.c_str(), value, 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

bool under_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

TEST(Launch, TorchrunAndSlurmEnvironments) {
  if (under_mpirun()) GTEST_SKIP() << "mpirun's variables take precedence";
  {
    ScopedEnv env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}, {"TORCHELASTIC_USE_AGENT_STORE", nullptr}});
    const LaunchInfo info = detect_launch();
    EXPECT_EQ(info.launcher, "env");
    EXPECT_EQ(info.rank, 3);
    EXPECT_EQ(info.world_size, 8);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 2);
    EXPECT_EQ(info.master_addr, "node0");
    EXPECT_EQ(info.master_port, 1234);
  }
  {
    ScopedEnv env({{"RANK", nullptr}, {"WORLD_SIZE", nullptr}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"},
                   {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "3(x2)"}});
    const LaunchInfo info = detect_launch();
    EXPECT_EQ(info.launcher, "env");
    EXPECT_EQ(info.rank, 5);
    EXPECT_EQ(info.world_size, 6);
    EXPECT_EQ(info.local_rank, 2);
    EXPECT_EQ(info.local_world_size, 3);
  }
  {
    ScopedEnv env({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
    EXPECT_THROW(detect_launch(), ValueError);  // a rank must be below the world size
  }
  {
    ScopedEnv env({{"RANK", "x"}, {"WORLD_SIZE", "4"}});
    EXPECT_THROW(detect_launch(), ValueError);
  }
}

TEST(Launch, MultiRankEnvironmentWithoutMpirunNeedsNcclOrMpirun) {
  if (under_mpirun()) GTEST_SKIP() << "mpirun's variables take precedence";
  ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  // CPU tensors travel through MPI, which needs mpirun: a clear error, not a hang.
  EXPECT_THROW(create_communicator({.device = Device::cpu()}), ValueError);
}

TEST(Rendezvous, RankZeroSendsItsBytesToEveryRank) {
  // A port picked from the pid (every rank of an mpirun job a different one), another when it is taken.
  const int world = 4;
  const std::string payload(128, '\x5a');
  for (int attempt = 0; attempt < 5; ++attempt) {
    LaunchInfo base;
    base.launcher = "env";
    base.world_size = world;
    base.master_addr = "127.0.0.1";
    base.master_port = 20000 + static_cast<int>((::getpid() * 7 + attempt * 977 + testing::job().rank() * 131) % 20000);
    std::vector<std::string> received(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        LaunchInfo me = base;
        me.rank = r;
        try {
          received[static_cast<size_t>(r)] = tcp_broadcast(r == 0 ? payload : std::string("ignored"), me, 10);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (std::thread& t : ranks) t.join();
    if (errors[0].find("cannot listen") != std::string::npos) continue;  // the port was taken: another one
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
      EXPECT_EQ(received[static_cast<size_t>(r)], payload) << "rank " << r;
    }
    return;
  }
  FAIL() << "no free port found";
}

TEST(Rendezvous, UnreachableRankZeroIsAnErrorAfterTheTimeout) {
  LaunchInfo me;
  me.launcher = "env";
  me.rank = 1;
  me.world_size = 2;
  me.master_addr = "127.0.0.1";
  me.master_port = 1;  // nobody listens there
  EXPECT_THROW(tcp_broadcast("", me, 0.3), BackendError);
}

}  // namespace
}  // namespace microllm::distributed
