// Helpers shared by the distributed tests: the job's communicator (MPI under mpirun, else the local one),
// seeds every rank agrees on, and a directory every rank of the job shares.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "microllm/distributed/communicator.h"
#include "test_support.h"

namespace microllm::distributed::testing {

inline Communicator& job() {
  static std::unique_ptr<Communicator> comm = create_communicator();
  return *comm;
}

// A fresh seed chosen by rank 0 (printed on failure through the test's "seed" property).
inline uint64_t shared_seed() {
  Tensor seed = Tensor::scalar(static_cast<double>(microllm::testing::fresh_seed() >> 12), DType::i64);
  job().broadcast(seed, 0);
  return static_cast<uint64_t>(seed.item<int64_t>());
}

// <tmp>/microllm_<tag>_<rank 0's pid>: the same path on every rank (one machine).
inline std::string shared_directory(const std::string& tag) {
  Tensor pid = Tensor::scalar(static_cast<double>(::getpid()), DType::i64);
  job().broadcast(pid, 0);
  return (std::filesystem::temp_directory_path() / ("microllm_" + tag + "_" + std::to_string(pid.item<int64_t>())))
      .string();
}

}  // namespace microllm::distributed::testing
