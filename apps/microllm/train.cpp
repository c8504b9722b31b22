// `microllm train`: train a model from scratch (or resume) on token files from `microllm prepare`.
//   microllm train --preset tiny --data data/tokens/kjv --steps 500 --out data/runs/tiny
//   microllm train --config model-s.json --device cuda --precision bf16-mixed
//   mpirun -np 4 microllm train --preset tiny --data data/tokens/kjv --zero1   (data parallel: docs/DISTRIBUTED.md)
// A JSON config holds any field of train::TrainConfig (include/microllm/train/trainer.h); flags override it.
// On a terminal a progress bar shows step, loss, lr, tokens/s and the ETA; otherwise one line per log.
// Ctrl-C saves a checkpoint after the current step and exits with status 130; --resume continues from it.
// An output directory that already holds a checkpoint needs --resume (continue) or --overwrite (start afresh).
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "microllm/core/threads.h"
#include "microllm/distributed/communicator.h"
#include "microllm/io/atomic_file.h"
#include "microllm/train/trainer.h"
#include "trace_file.h"

namespace microllm::app {
namespace {

struct TrainCliOptions {
  std::string config_path;
  std::string preset;
  std::string data;
  std::string out;
  std::string device;
  std::string precision;
  int64_t steps = 0, batch_size = 0, seq_len = 0, grad_accum = 0, warmup = -1, eval_interval = -1;
  double lr = 0;
  int threads = 0;
  int64_t seed = -1;
  bool resume = false;
  bool resume_if_exists = false;
  bool overwrite = false;
  bool keep_best = false;
  std::string distributed;  // auto | off | mpi | nccl
  bool zero1 = false;
  std::vector<std::string> sets;  // key=value, value as JSON (a bare word is a string)
  std::string trace;              // --trace FILE (rank 0's spans)
};

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buffer[32];
  if (s >= 3600) {
    std::snprintf(buffer, sizeof(buffer), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buffer;
}

train::TrainConfig build_config(const TrainCliOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  if (!o.config_path.empty()) {
    try {
      j = nlohmann::json::parse(io::read_text_file(o.config_path));
    } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e309
      throw ParseError(o.config_path, str_cat("not JSON: ", e.what()));
    }
  }
  if (!o.preset.empty()) j["model"] = o.preset;
  if (!o.data.empty()) j["data"] = o.data;
  if (!o.out.empty()) j["out_dir"] = o.out;
  if (!o.device.empty()) j["device"] = o.device;
  if (!o.precision.empty()) j["precision"] = o.precision;
  if (o.steps > 0) j["steps"] = o.steps;
  if (o.batch_size > 0) j["batch_size"] = o.batch_size;
  if (o.seq_len > 0) j["seq_len"] = o.seq_len;
  if (o.grad_accum > 0) j["grad_accum"] = o.grad_accum;
  if (o.warmup >= 0) j["warmup_steps"] = o.warmup;
  if (o.eval_interval >= 0) j["eval_interval"] = o.eval_interval;
  if (o.lr > 0) j["lr"] = o.lr;
  if (o.threads > 0) j["threads"] = o.threads;
  if (o.seed >= 0) j["seed"] = static_cast<uint64_t>(o.seed);
  if (o.resume) j["resume"] = true;
  if (o.resume_if_exists) j["resume_if_exists"] = true;
  if (o.overwrite) j["overwrite"] = true;
  if (o.keep_best) j["keep_best"] = true;
  if (!o.distributed.empty()) j["distributed"] = o.distributed;
  if (o.zero1) j["zero1"] = true;
  for (const std::string& kv : o.sets) {
    const size_t eq = kv.find('=');
    MICROLLM_CHECK(eq != std::string::npos && eq > 0, ValueError, "train", "--set expects key=value, got '", kv, "'");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    try {
      j[key] = nlohmann::json::parse(value);
    } catch (const nlohmann::json::exception&) {  // parse_error, and out_of_range for 1e309
      j[key] = value;  // a bare word: a string
    }
  }
  return train::TrainConfig::from_json(j.dump(), o.config_path.empty() ? "train options" : o.config_path);
}

// Trains as the options say; returns whether a Ctrl-C (SIGINT) ended the run early.
bool run_train(const TrainCliOptions& o) {
  // Keep freed tensor memory in the heap: every step allocates the same activations again, and memory
  // handed back to the kernel (glibc's default for blocks of a few MB) faults its pages in again on every
  // step, a fifth of the time of a CPU step.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const train::TrainConfig config = build_config(o);
  const bool terminal = ::isatty(STDOUT_FILENO) != 0;
  train::Trainer trainer(config);
  if (trainer.rank() != 0) return trainer.run().interrupted;  // data parallel: rank 0 speaks for the job
  const nn::TransformerConfig& mc = trainer.model().config();
  std::cout << "train: " << config.model << " (" << mc.model_type << ", " << trainer.model().num_parameters() / 1e6
            << "M parameters, vocab " << mc.vocab_size << ") on " << trainer.device() << ", " << config.precision
            << ", batch " << config.batch_size << "x" << config.seq_len << " x" << config.grad_accum << ", "
            << config.steps << " steps, lr " << config.lr << " (" << config.schedule << ", warmup "
            << config.warmup_steps << "), " << num_threads() << " CPU threads\n";
  if (trainer.world_size() > 1) {
    std::cout << "train: data parallel over " << trainer.world_size() << " ranks ("
              << (trainer.device().is_cuda() ? "NCCL" : "MPI") << (config.zero1 ? ", ZeRO-1" : "") << "), "
              << config.batch_size / trainer.world_size() << " of the " << config.batch_size
              << " rows of each batch per rank\n";
  }
  for (const std::string& warning : config.warnings()) std::cerr << "warning: train: " << warning << std::endl;
  if (trainer.resumed() && trainer.step() >= config.steps) {
    std::cout << "train: already complete: " << config.resolved_checkpoint_dir() << " holds step " << trainer.step()
              << " of " << config.steps << "; nothing to train\n";
  } else if (trainer.resumed()) {
    std::cout << "train: resumed from " << config.resolved_checkpoint_dir() << " at step " << trainer.step() << "\n";
  }
  std::cout << "train: writing " << config.out_dir << "/metrics.jsonl, loss.svg and "
            << config.resolved_checkpoint_dir() << "/ (Ctrl-C saves a checkpoint and stops)" << std::endl;

  const int64_t start_step = trainer.step();
  train::StepMetrics last;
  bool have_last = false;
  const auto clock_start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count(); };
  auto eta = [&](int64_t step) {
    const int64_t done = step - start_step;
    return done > 0 ? seconds() / static_cast<double>(done) * static_cast<double>(config.steps - step) : NAN;
  };
  auto bar = [&](int64_t step) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * step / std::max<int64_t>(config.steps, 1));
    std::string line = "\r[" + std::string(filled, '#') + std::string(kWidth - filled, '-') + "] ";
    char buffer[160];
    std::snprintf(buffer, sizeof(buffer), "step %lld/%lld", static_cast<long long>(step),
                  static_cast<long long>(config.steps));
    line += buffer;
    if (have_last) {
      std::snprintf(buffer, sizeof(buffer), "  loss %.4f  lr %.2e  %.0f tok/s", last.loss, last.lr,
                    last.tokens_per_second);
      line += buffer;
    }
    line += "  ETA " + format_duration(eta(step)) + "   ";
    std::cout << line << std::flush;
  };

  train::TrainCallbacks callbacks;
  callbacks.on_step = [&](int64_t step) {
    if (terminal) bar(step);
  };
  callbacks.on_log = [&](const train::StepMetrics& m) {
    last = m;
    have_last = true;
    if (terminal) {
      bar(m.step);
    } else {
      std::printf("step %lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tok/s  elapsed %s  ETA %s",
                  static_cast<long long>(m.step), static_cast<long long>(config.steps), m.loss, m.lr, m.grad_norm,
                  m.tokens_per_second, format_duration(m.elapsed_seconds).c_str(),
                  format_duration(eta(m.step)).c_str());
      if (m.comm_timed) {
        std::printf("  gradient collectives %.2f ms/step, %.0f%% hidden behind backward, %.2f ms exposed",
                    m.comm_ms, m.comm_ms > 0 ? 100 * m.comm_hidden_ms / m.comm_ms : 0.0, m.comm_exposed_ms);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  };
  callbacks.on_eval = [&](const train::EvalMetrics& m) {
    if (terminal) std::cout << "\n";
    std::printf("eval step %lld: val loss %.4f nats/token, %.4f nats/byte (%.1fs)\n", static_cast<long long>(m.step),
                m.loss, m.nats_per_byte, m.seconds);
    std::fflush(stdout);
  };
  callbacks.on_checkpoint = [&](const std::string& dir) {
    if (terminal) std::cout << "\n";
    std::cout << "checkpoint: " << dir << " (step " << trainer.step() << ")" << std::endl;
  };
  TraceFile trace(o.trace);
  const train::TrainResult result = trainer.run(callbacks);
  trace.finish();
  if (terminal) std::cout << "\n";
  std::cout << (result.interrupted ? "train: interrupted at step " : "train: done, step ") << result.steps << " in "
            << format_duration(result.seconds) << " (" << result.seconds << " s)";
  if (result.last_eval) std::cout << ", val loss " << result.last_eval->nats_per_byte << " nats/byte";
  if (result.peak_device_bytes > 0) {
    std::cout << ", peak device memory " << static_cast<double>(result.peak_device_bytes) / 1e9 << " GB";
  }
  if (result.peak_bytes_per_rank.size() > 1) {
    std::cout << "\ntrain: peak " << (trainer.device().is_cuda() ? "device memory" : "resident memory") << " per rank:";
    for (size_t r = 0; r < result.peak_bytes_per_rank.size(); ++r)
      std::cout << (r ? ", " : " ") << static_cast<double>(result.peak_bytes_per_rank[r]) / 1e9 << " GB";
  }
  std::cout << "\ntrain: loss curve " << config.out_dir << "/loss.svg, checkpoint " << result.checkpoint_dir
            << std::endl;
  return result.interrupted;
}

}  // namespace

void register_train(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train", "Train a model from scratch (or resume) on prepared token files");
  auto o = std::make_shared<TrainCliOptions>();
  // An option given twice takes its last value: a script can append to its own command (scripts/quickstart.sh).
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--config", o->config_path, "JSON train config (fields of train::TrainConfig)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--preset", o->preset, "Model preset (tiny, model-s, model-m) or an HF config.json");
  cmd->add_option("--data", o->data, "Token file prefix from `microllm prepare` (PREFIX.train.bin, PREFIX.val.bin)");
  cmd->add_option("--out", o->out, "Output directory: metrics.jsonl, loss.svg, checkpoint/");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N");
  cmd->add_option("--precision", o->precision, "fp32 or bf16-mixed");
  cmd->add_option("--steps", o->steps, "Optimizer steps");
  cmd->add_option("--batch-size", o->batch_size, "Sequences per micro-batch");
  cmd->add_option("--seq-len", o->seq_len, "Tokens per sequence");
  cmd->add_option("--grad-accum", o->grad_accum, "Micro-batches per optimizer step");
  cmd->add_option("--lr", o->lr, "Peak learning rate");
  cmd->add_option("--warmup", o->warmup, "Warmup steps");
  cmd->add_option("--eval-interval", o->eval_interval, "Steps between evaluations (0: at the end only)");
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)");
  cmd->add_option("--seed", o->seed, "Seed of the initialization and the batch sampler");
  cmd->add_flag("--resume", o->resume, "Continue from the checkpoint in the output directory (there must be one)");
  cmd->add_flag("--resume-if-exists", o->resume_if_exists,
                "Continue from the checkpoint in the output directory if there is one, else start afresh");
  cmd->add_flag("--overwrite", o->overwrite, "Start afresh and replace the checkpoint in the output directory");
  cmd->add_flag("--keep-best", o->keep_best, "Also keep the checkpoint of the lowest validation loss (CHECKPOINT-best)");
  cmd->add_option("--distributed", o->distributed,
                  "Data parallelism: auto (when launched by mpirun or torchrun), off, or a backend (mpi, nccl)")
      ->check(CLI::IsMember({"auto", "off", "mpi", "nccl"}));
  cmd->add_flag("--zero1", o->zero1, "Data parallel: shard the optimizer state over the ranks (ZeRO-1)");
  add_trace_option(cmd, o->trace);
  cmd->add_option("--set", o->sets, "Any config field: --set key=value (value as JSON; bare words are strings)");
  cmd->callback([o] {
    bool interrupted = false;
    try {
      interrupted = run_train(*o);
    } catch (const std::exception& e) {
      // In a data-parallel job the other ranks would wait for this one at their next collective.
      if (distributed::detect_launch().world_size > 1) distributed::abort_job(str_cat("error: ", e.what()));
      throw;
    }
    // Saved, but stopped early: 128 + SIGINT, the status a shell gives a command that Ctrl-C ended.
    if (interrupted) throw CLI::RuntimeError(128 + SIGINT);
  });
}

}  // namespace microllm::app
