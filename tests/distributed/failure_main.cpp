// A data-parallel run in which rank 1 fails after step 2, for the failure tests (tests/CMakeLists.txt):
//   mpirun -np 2 distributed_failure throw DIR   rank 1 throws out of the training loop
//   mpirun -np 2 distributed_failure kill DIR    rank 1 dies from SIGKILL
// The other ranks are then in their next collective. The job must end with a non-zero status and a message,
// within a bounded time (check_failure.cmake times it), not hang.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>

#include "microllm/io/atomic_file.h"
#include "microllm/train/trainer.h"

int main(int argc, char** argv) {
  using namespace microllm;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s throw|kill DIR\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  const char* rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = rank_env != nullptr ? std::atoi(rank_env) : 0;
  const std::string root = dir + "/rank" + std::to_string(rank);
  std::filesystem::create_directories(root);
  std::string text;
  for (int i = 0; i < 100; ++i) text += "Let there be light: and there was light. " + std::to_string(i) + "\n";
  io::write_text_atomically(root + "/corpus.txt", text);
  train::PrepareOptions options;
  options.inputs = {root + "/corpus.txt"};
  options.output = root + "/corpus";
  options.val_fraction = 0;
  train::prepare_token_files(options);

  train::TrainConfig config;
  config.model = "tiny";
  config.train_data = root + "/corpus.train.bin";
  config.batch_size = 4;
  config.seq_len = 16;
  config.steps = 1000;  // far more than run before the failure
  config.eval_interval = 0;
  config.out_dir = root + "/run";
  train::Trainer trainer(config);
  train::TrainCallbacks callbacks;
  callbacks.on_step = [&](int64_t step) {
    if (trainer.rank() != 1 || step != 2) return;
    if (mode == "kill") std::raise(SIGKILL);
    throw ValueError("failure test", "rank 1 fails on purpose after step 2");
  };
  trainer.run(callbacks);
  std::fprintf(stderr, "rank %d: training finished, which it should not have\n", trainer.rank());
  return 0;
}
