// `microllm prepare`, `train` and `generate` on a trained checkpoint, run as a user runs them: the
// executable on a small random text, a tiny preset for a few steps. What a run does with a checkpoint
// already there (refuse, --overwrite, --resume, --resume-if-exists), the exit status of a run that Ctrl-C
// stopped (130), the warning of a warmup longer than the run, errors that name the file or list the choices.
// The executable is $MICROLLM_BIN, else apps/microllm beside this test's build folder; the tests skip,
// saying so, when it has not been built.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_testing.h"
#include "microllm/io/atomic_file.h"
#include "test_support.h"

extern char** environ;

namespace microllm {
namespace {

namespace fs = std::filesystem;

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = testing::microllm_binary();
    if (!fs::exists(bin_)) GTEST_SKIP() << bin_ << " is not built (cmake --build ... --target microllm_app)";
    const uint64_t seed = testing::fresh_seed();
    root_ = fs::temp_directory_path() / ("microllm_train_cli_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    std::string text;  // random words: 40 KB
    uint64_t state = seed;
    while (text.size() < 40000) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      text += std::string(1 + (state >> 60) % 8, static_cast<char>('a' + (state >> 40) % 26)) +
              ((state >> 33) % 9 ? " " : ".\n");
    }
    io::write_text_atomically(path("corpus.txt"), text);
    const std::string prepared = run("prepare --input " + path("corpus.txt") + " --output " + path("tokens"));
    ASSERT_EQ(status_, 0) << prepared;
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  std::string path(const std::string& name) const { return (root_ / name).string(); }
  // Runs `microllm ARGS`; returns stdout and stderr together and keeps the exit status in status_.
  std::string run(const std::string& args) {
    std::string output;
    status_ = testing::run_command(bin_.string() + " " + args, output);
    return output;
  }
  // `train` for a few steps of the tiny preset on the prepared tokens, into `out`.
  std::string train_args(const std::string& out, const std::string& more = "", int steps = 2, int warmup = 1) const {
    return "train --preset tiny --data " + path("tokens") + " --out " + path(out) + " --steps " +
           std::to_string(steps) + " --warmup " + std::to_string(warmup) +
           " --batch-size 2 --seq-len 16 --eval-interval 0 --threads 1 --set eval_batches=1 " + more;
  }
  std::string train(const std::string& out, const std::string& more = "", int steps = 2, int warmup = 1) {
    return run(train_args(out, more, steps, warmup));
  }

  fs::path bin_, root_;
  int status_ = -1;
};

TEST_F(TrainCli, RefusesACheckpointAlreadyThereUnlessResumeOrOverwrite) {
  std::string out = train("run");
  ASSERT_EQ(status_, 0) << out;
  const std::string checkpoint = path("run") + "/checkpoint";
  out = train("run");
  EXPECT_EQ(status_, 1) << out;
  for (const std::string& part : {checkpoint, std::string("already holds a checkpoint at step 2 of 2"),
                                  std::string("--resume"), std::string("--overwrite")}) {
    EXPECT_NE(out.find(part), std::string::npos) << "lacks '" << part << "': " << out;
  }
  out = train("run", "--overwrite", 3);
  EXPECT_EQ(status_, 0) << out;
  EXPECT_NE(out.find("train: done, step 3"), std::string::npos) << out;
  // --resume needs a checkpoint; --resume-if-exists starts afresh without one.
  out = train("elsewhere", "--resume");
  EXPECT_EQ(status_, 1) << out;
  EXPECT_NE(out.find(path("elsewhere") + "/checkpoint holds no checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("--resume-if-exists"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(path("elsewhere") + "/checkpoint"));
  out = train("elsewhere", "--resume-if-exists");
  EXPECT_EQ(status_, 0) << out;
  EXPECT_EQ(out.find("resumed"), std::string::npos) << out;
  out = train("elsewhere", "--resume-if-exists", 3);
  EXPECT_EQ(status_, 0) << out;
  EXPECT_NE(out.find("train: resumed from " + path("elsewhere") + "/checkpoint at step 2"), std::string::npos) << out;
}

TEST_F(TrainCli, ResumingAFinishedRunNamesItsCheckpoint) {
  std::string out = train("done");
  ASSERT_EQ(status_, 0) << out;
  out = train("done", "--resume");
  EXPECT_EQ(status_, 0) << out;
  const std::string checkpoint = path("done") + "/checkpoint";
  EXPECT_NE(out.find("train: already complete: " + checkpoint + " holds step 2 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("checkpoint " + checkpoint + "\n"), std::string::npos) << out;
  // More steps, appended as scripts/quickstart.sh appends its arguments (the last --steps counts).
  out = train("done", "--resume --steps 3");
  EXPECT_EQ(status_, 0) << out;
  EXPECT_NE(out.find("train: resumed from " + checkpoint + " at step 2"), std::string::npos) << out;
  EXPECT_NE(out.find("train: done, step 3"), std::string::npos) << out;
}

TEST_F(TrainCli, WarnsOnceOnStderrWhenTheWarmupOutlastsTheSteps) {
  std::string out;  // stdout only: stderr goes to a file
  ASSERT_EQ(testing::run_command(
                "{ " + bin_.string() + " " + train_args("warmup", "", 2, 7) + " 2>" + path("stderr.txt") + "; }", out),
            0)
      << out;
  const std::string err = io::read_text_file(path("stderr.txt"));
  EXPECT_EQ(testing::count_of(err, "warning: train: steps 2 is fewer than warmup_steps 7"), 1u) << err;
  EXPECT_EQ(testing::count_of(out, "warning:"), 0u) << "the warning goes to stderr only: " << out;
  const std::string quiet = train("quiet", "", 2, 2);
  EXPECT_EQ(testing::count_of(quiet, "warning:"), 0u) << quiet;
}

// Ctrl-C: the run saves a checkpoint after the current step and exits with 128 + SIGINT. The signal is sent
// once the first step has been logged (the handler is in place from before the first step).
TEST_F(TrainCli, SigintSavesACheckpointAndExitsWith130) {
  const std::string command = bin_.string() + " train --preset tiny --data " + path("tokens") + " --out " +
                              path("stopped") +
                              " --steps 1000000 --batch-size 2 --seq-len 16 --eval-interval 0 --threads 1"
                              " --set log_interval=1 --set eval_batches=1 2>&1";
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t default_signals;  // SIGINT as a terminal delivers it, even where this test runs with it ignored
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGINT);
  posix_spawnattr_setsigdefault(&attributes, &default_signals);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF);
  // exec: the shell becomes the command, so the signal reaches microllm itself.
  const std::string exec_command = "exec " + command;
  const char* argv[] = {"/bin/sh", "-c", exec_command.c_str(), nullptr};
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, "/bin/sh", &actions, &attributes, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(pipe_fds[1]);
  ASSERT_EQ(spawned, 0);
  FILE* output = ::fdopen(pipe_fds[0], "r");
  ASSERT_NE(output, nullptr);
  std::string log;
  char line[4096];
  bool signalled = false;
  while (std::fgets(line, sizeof line, output) != nullptr) {
    log += line;
    if (!signalled && std::string(line).starts_with("step 1/")) {
      ASSERT_EQ(::kill(pid, SIGINT), 0);
      signalled = true;
    }
  }
  std::fclose(output);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(signalled) << log;
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ": " << log;
  EXPECT_EQ(WEXITSTATUS(status), 130) << log;
  EXPECT_NE(log.find("train: interrupted at step"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(path("stopped") + "/checkpoint/trainer_state.json")) << log;
}

TEST_F(TrainCli, PrepareRefusesAnEmptyFileAndAnUnknownPresetListsThePresets) {
  io::write_text_atomically(path("empty.txt"), "");
  std::string out = run("prepare --input " + path("empty.txt") + " --output " + path("empty"));
  EXPECT_EQ(status_, 1) << out;
  EXPECT_NE(out.find(path("empty.txt") + " is empty"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(path("empty.train.bin")));
  io::write_text_atomically(path("short.txt"), "Too short to split.\n");
  out = run("prepare --input " + path("short.txt") + " --output " + path("short"));
  EXPECT_EQ(status_, 1) << out;
  EXPECT_NE(out.find("no tokens are left for validation"), std::string::npos) << out;

  out = run("train --preset huge --data " + path("tokens") + " --out " + path("huge"));
  EXPECT_EQ(status_, 1) << out;
  EXPECT_NE(out.find("'huge' is neither a preset (tiny, model-s, model-m) nor a path to a Hugging Face config.json"),
            std::string::npos)
      << out;
}

// A byte-level checkpoint has no bos token: generate without a prompt says to give one, as --help does.
TEST_F(TrainCli, GenerateFromAByteLevelCheckpointNeedsAPrompt) {
  std::string out = train("bytes");
  ASSERT_EQ(status_, 0) << out;
  const std::string checkpoint = path("bytes") + "/checkpoint";
  out = run("generate --checkpoint " + checkpoint + " --max-tokens 4");
  EXPECT_EQ(status_, 1) << out;
  EXPECT_NE(out.find(checkpoint + " has no bos token to start from"), std::string::npos) << out;
  EXPECT_NE(out.find("give --prompt TEXT"), std::string::npos) << out;
  out = run("generate --help");
  EXPECT_NE(out.find("checkpoint of `microllm train`, needs a prompt"), std::string::npos) << out;
  out = run("generate --checkpoint " + checkpoint + " --prompt And --max-tokens 4 --seed 1");
  EXPECT_EQ(status_, 0) << out;
  EXPECT_TRUE(out.starts_with("And")) << out;
}

}  // namespace
}  // namespace microllm
