// The training loop: a TransformerLM from a preset or a Hugging Face config, random windows from a token
// file, gradient accumulation, global-norm clipping on the device, AdamW or SGD on f32 master weights
// (fp32, or bf16-mixed compute), evaluation on fixed validation windows, metrics as JSONL, a loss-curve
// SVG, atomic checkpoints and exact resume, and a clean stop on SIGINT.
//
//   train::TrainConfig config = train::TrainConfig::from_json(text);
//   train::Trainer trainer(config);            // fresh, or resumed from config.checkpoint_dir
//   train::TrainResult result = trainer.run();
//
// One optimizer step: for each of grad_accum micro-batches, loss / grad_accum backward (gradients add up
// in the parameters); the gradient norm and the clip factor are computed on the device; the optimizer
// reads the factor there; gradients are dropped. The host reads the loss and the norm only when it logs.
//
// Data parallel (docs/DISTRIBUTED.md): launched by mpirun or with torchrun's environment, each process
// (rank) trains the same model on rows [rank * B / W, (rank + 1) * B / W) of every global batch of B rows,
// and distributed::DataParallel averages the gradients, so the steps, the batches and the learning-rate
// schedule are those of one process with batch B. Rank 0 alone writes metrics and checkpoints (the others
// wait); checkpoints load at any world size. Callbacks run on every rank (Trainer::rank() says which).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "microllm/nn/transformer.h"
#include "microllm/train/data.h"
#include "microllm/train/optimizer.h"
#include "microllm/train/schedule.h"

namespace microllm::distributed {
class Communicator;
class DataParallel;
}  // namespace microllm::distributed

namespace microllm::train {

struct TrainConfig {
  // model
  std::string model = "tiny";        // a preset (tiny, model-s, model-m) or an HF config.json (file or directory)
  std::string model_type = "llama";  // presets: llama, qwen2 (q/k/v biases) or qwen3 (qk-norm)
  // data: token files from `microllm prepare`; `data` (a prefix) sets both
  std::string train_data, val_data;
  std::string
      tokenizer;  // an HF tokenizer to copy into checkpoints; "": the one prepare left beside the files, or bytes
  int64_t batch_size = 32, seq_len = 128, grad_accum = 1, steps = 1000;
  // A wall-clock budget (0: none). Training stops when it is spent, and the learning-rate schedule then
  // follows the time spent rather than the steps (a run "for 10 minutes"); such runs do not resume exactly.
  double max_seconds = 0;
  // optimization
  std::string optimizer = "adamw";  // adamw | sgd
  double lr = 3e-3, min_lr_ratio = 0.1;
  int64_t warmup_steps = 50;
  std::string schedule = "cosine";  // cosine | linear | constant (after the warmup)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, momentum = 0.9;
  std::string optimizer_dtype = "f32";  // f32 | bf16 moments
  double clip = 1.0;                    // max global gradient norm; 0 turns clipping off
  std::string precision = "fp32";       // fp32 | bf16-mixed (f32 masters, bf16 compute)
  std::string device = "cpu";           // cpu | cuda | cuda:N
  // evaluation, logging, checkpoints
  int64_t eval_interval = 100;  // steps between evaluations (and at the end); 0: only at the end
  int64_t eval_batches = 16;    // validation batches of [batch_size, seq_len]
  int64_t log_interval = 10;
  int64_t checkpoint_interval = 0;          // 0: only at the end (and on SIGINT)
  std::string out_dir = "data/runs/train";  // metrics.jsonl, loss.svg, and checkpoint/ unless checkpoint_dir is set
  std::string checkpoint_dir;
  // Also keep the checkpoint of the lowest validation loss so far in best_checkpoint_dir() (rewritten at
  // each evaluation that improves on it): a run that overfits still leaves its best model.
  bool keep_best = false;
  uint64_t seed = 1337;  // model initialization and the batch sampler
  // A checkpoint already in checkpoint_dir: `resume` continues from it, `overwrite` trains afresh and replaces
  // it, and with neither the Trainer refuses to start. `resume` with no checkpoint there is refused too, unless
  // `resume_if_exists` (alone it means: resume when there is a checkpoint, else start afresh).
  bool resume = false;
  bool resume_if_exists = false;
  bool overwrite = false;
  int threads = 0;  // CPU threads (0: OMP_NUM_THREADS or all cores)
  // data parallel: auto (a job launched by mpirun / torchrun: MPI on the CPU, NCCL on GPUs), off, or a backend
  // forced even for one process (mpi, nccl); batch_size is the global batch, split over the ranks
  std::string distributed = "auto";
  bool zero1 = false;      // shard the optimizer state over the ranks (ZeRO-1)
  double bucket_mb = 25;   // gradient bucket size (MB)
  // Profiling: time the gradient buckets' collectives against the end of backward on every step and log,
  // per step, how long they ran, how much of that was hidden behind backward, and how long the step waited
  // for them after backward (StepMetrics::comm_*; rank 0's clock). Off: no events, no extra waits.
  bool time_collectives = false;
  // NCCL: a collective (or the rendezvous) that has not finished after this long is an error that ends the
  // job (a peer died or is stuck and no launcher noticed).
  double comm_timeout_seconds = 300;

  // JSON object with the fields above (plus "data": prefix). Unknown keys are a ParseError (typos).
  static TrainConfig from_json(const std::string& json_text, const std::string& origin = "config");
  std::string to_json() const;
  void validate() const;  // ValueError naming the field
  // Settings that are valid but probably not meant, one sentence each (`microllm train` prints them to
  // stderr): steps fewer than warmup_steps, so that the learning rate never reaches its peak.
  std::vector<std::string> warnings() const;
  std::string resolved_checkpoint_dir() const;
  std::string best_checkpoint_dir() const;  // resolved_checkpoint_dir() + "-best"
  LrSchedule lr_schedule() const;
};

struct StepMetrics {
  int64_t step = 0;  // optimizer steps done
  double loss = 0;   // mean training loss (nats/token) since the previous log
  double lr = 0;
  double grad_norm = 0;  // before clipping, at the last step
  double tokens_per_second = 0;
  double elapsed_seconds = 0;
  int64_t tokens = 0;  // tokens trained on so far
  // With time_collectives (data parallel), means per step since the previous log, on rank 0
  // (distributed::CollectiveTiming): the gradient collectives' time, its part before backward ended, and
  // the wait after backward.
  bool comm_timed = false;
  double comm_ms = 0, comm_hidden_ms = 0, comm_exposed_ms = 0;
};

struct EvalMetrics {
  int64_t step = 0;
  double loss = 0;           // nats/token over the validation windows
  double nats_per_byte = 0;  // loss / bytes per token (the same for the byte tokenizer)
  double seconds = 0;
};

struct TrainCallbacks {
  std::function<void(const StepMetrics&)> on_log;
  std::function<void(const EvalMetrics&)> on_eval;
  std::function<void(int64_t step)> on_step;  // after every optimizer step
  std::function<void(const std::string& dir)> on_checkpoint;
};

struct TrainResult {
  int64_t steps = 0;  // optimizer steps done in total
  bool interrupted = false;
  std::optional<EvalMetrics> last_eval;
  // The checkpoint that holds the final state: the last one saved, or the one resumed from when it was
  // already at config.steps (nothing left to train).
  std::string checkpoint_dir;
  double seconds = 0;
  size_t peak_device_bytes = 0;  // the caching allocator's peak on a CUDA device (0 on the CPU)
  // Per rank (one entry without data parallelism): the CUDA allocator's peak, or the peak resident set
  // size of the process on the CPU.
  std::vector<size_t> peak_bytes_per_rank;
};

class Trainer {
 public:
  // Builds the model, optimizer, sampler and validation windows; with config.resume (or resume_if_exists) and
  // a checkpoint in checkpoint_dir, restores all of them from it. ValueError naming the directory when it
  // holds a checkpoint and neither resume nor overwrite is set, or when resume finds no checkpoint there
  // (without resume_if_exists).
  explicit Trainer(TrainConfig config);
  ~Trainer();

  // Trains to config.steps: logs, evaluates, checkpoints on schedule; on SIGINT (Ctrl-C) saves a checkpoint
  // after the current step and returns with interrupted set. Writes metrics.jsonl and loss.svg to out_dir.
  TrainResult run(const TrainCallbacks& callbacks = {});
  // One optimizer step (grad_accum micro-batches).
  void train_step();
  EvalMetrics evaluate();
  void save_checkpoint(const std::string& dir);
  void load_checkpoint(const std::string& dir);

  nn::TransformerLM& model() { return *model_; }
  Optimizer& optimizer() { return *optimizer_; }
  const TrainConfig& config() const { return config_; }
  int64_t step() const { return optimizer_->steps(); }
  bool resumed() const { return resumed_; }
  Device device() const { return device_; }
  // Data parallelism: this process's rank and the number of ranks (0 and 1 without it).
  int rank() const;
  int world_size() const;
  distributed::DataParallel* data_parallel() { return ddp_.get(); }  // null without it

 private:
  TrainResult run_loop(const TrainCallbacks& callbacks);
  void zero_grad();
  bool stop_requested();        // SIGINT on any rank
  double train_seconds();       // this run's training clock (data parallel: the ranks' mean)
  StepMetrics flush_log();
  void write_metrics_line(const std::string& line);
  void write_loss_curve() const;

  TrainConfig config_;
  Device device_;
  DType compute_dtype_ = DType::f32;
  std::unique_ptr<TokenFile> train_file_, val_file_;
  std::unique_ptr<BatchSampler> sampler_;
  std::vector<Batch> val_batches_;
  std::unique_ptr<nn::TransformerLM> model_;
  std::unique_ptr<distributed::Communicator> comm_;  // null, or the job's (data parallel)
  std::unique_ptr<distributed::DataParallel> ddp_;
  std::unique_ptr<Optimizer> optimizer_;
  LrSchedule schedule_;
  bool resumed_ = false;

  // Since the last log: the summed micro-step losses (a device scalar) and their count.
  Tensor loss_sum_;
  int64_t loss_count_ = 0;
  Tensor last_grad_norm_;
  int64_t tokens_ = 0;
  int64_t tokens_at_log_ = 0;
  double seconds_before_ = 0;  // training time of earlier runs (resume)
  double log_clock_ = 0, run_clock_ = 0;
  std::vector<StepMetrics> train_history_;
  std::vector<EvalMetrics> eval_history_;
};

// Ctrl-C: Trainer::run installs a SIGINT handler that sets this flag (a second Ctrl-C kills as usual).
bool interrupt_requested();
void clear_interrupt();
// Sets the flag as Ctrl-C does: the run stops after the current step, saving a checkpoint (for a callback that
// decides to stop, e.g. from Python). Async-signal-safe.
void request_interrupt();

}  // namespace microllm::train
