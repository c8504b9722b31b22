#include "microllm/train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "microllm/autograd/functions.h"
#include "microllm/core/cuda.h"
#include "microllm/core/threads.h"
#include "microllm/distributed/communicator.h"
#include "microllm/distributed/ddp.h"
#include "microllm/io/atomic_file.h"
#include "microllm/io/safetensors.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/optim.h"
#include "microllm/profile/trace.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "microllm/train/checkpoint.h"
#include "microllm/train/plot.h"

namespace microllm::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

// ---- SIGINT ----

namespace {
volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_sigint(int) { g_interrupted = 1; }

// Installs the handler for its scope; SA_RESETHAND makes a second Ctrl-C kill the process as usual.
class SigintGuard {
 public:
  SigintGuard() {
    struct sigaction action {};
    action.sa_handler = on_sigint;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    installed_ = ::sigaction(SIGINT, &action, &previous_) == 0;
  }
  ~SigintGuard() {
    if (installed_) ::sigaction(SIGINT, &previous_, nullptr);
  }
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;

 private:
  struct sigaction previous_ {};
  bool installed_ = false;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

bool interrupt_requested() { return g_interrupted != 0; }
void clear_interrupt() { g_interrupted = 0; }
void request_interrupt() { g_interrupted = 1; }

// ---- TrainConfig ----

namespace {
// Every field of TrainConfig with its JSON name: one list for reading and writing.
template <typename C, typename F>
void for_each_field(C& c, F&& f) {
  f("model", c.model);
  f("model_type", c.model_type);
  f("train_data", c.train_data);
  f("val_data", c.val_data);
  f("tokenizer", c.tokenizer);
  f("batch_size", c.batch_size);
  f("seq_len", c.seq_len);
  f("grad_accum", c.grad_accum);
  f("steps", c.steps);
  f("max_seconds", c.max_seconds);
  f("optimizer", c.optimizer);
  f("lr", c.lr);
  f("min_lr_ratio", c.min_lr_ratio);
  f("warmup_steps", c.warmup_steps);
  f("schedule", c.schedule);
  f("beta1", c.beta1);
  f("beta2", c.beta2);
  f("eps", c.eps);
  f("weight_decay", c.weight_decay);
  f("momentum", c.momentum);
  f("optimizer_dtype", c.optimizer_dtype);
  f("clip", c.clip);
  f("precision", c.precision);
  f("device", c.device);
  f("eval_interval", c.eval_interval);
  f("eval_batches", c.eval_batches);
  f("log_interval", c.log_interval);
  f("checkpoint_interval", c.checkpoint_interval);
  f("out_dir", c.out_dir);
  f("checkpoint_dir", c.checkpoint_dir);
  f("keep_best", c.keep_best);
  f("seed", c.seed);
  f("resume", c.resume);
  f("resume_if_exists", c.resume_if_exists);
  f("overwrite", c.overwrite);
  f("threads", c.threads);
  f("distributed", c.distributed);
  f("zero1", c.zero1);
  f("bucket_mb", c.bucket_mb);
  f("time_collectives", c.time_collectives);
  f("comm_timeout_seconds", c.comm_timeout_seconds);
}

bool is_preset(const std::string& model) { return model == "tiny" || model == "model-s" || model == "model-m"; }

template <typename T>
void read_value(const json& v, T& out, const std::string& key, const std::string& origin) {
  auto fail = [&](const char* what) {
    throw ParseError(origin, str_cat("field '", key, "' must be ", what, ", got ", v.dump()));
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) fail("a string");
    out = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) fail("true or false");
    out = v.get<bool>();
  } else if constexpr (std::is_same_v<T, double>) {
    if (!v.is_number()) fail("a number");
    out = v.get<double>();
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    if (!v.is_number_unsigned()) fail("a non-negative integer");
    out = v.get<uint64_t>();
  } else {
    if (!v.is_number_integer()) fail("an integer");
    out = v.get<T>();
  }
}
}  // namespace

TrainConfig TrainConfig::from_json(const std::string& json_text, const std::string& origin) {
  const json j = detail::parse_json(json_text, origin, "not JSON");
  MICROLLM_CHECK(j.is_object(), ParseError, origin, "a train config must be a JSON object");
  TrainConfig c;
  for (const auto& [key, value] : j.items()) {
    if (key == "data") {
      std::string prefix;
      read_value(value, prefix, key, origin);
      if (prefix.ends_with(".bin")) prefix.resize(prefix.size() - 4);
      c.train_data = prefix + ".train.bin";
      c.val_data = prefix + ".val.bin";
      continue;
    }
    bool known = false;
    for_each_field(c, [&](const char* name, auto& field) {
      if (key == name) {
        read_value(value, field, key, origin);
        known = true;
      }
    });
    MICROLLM_CHECK(known, ParseError, origin, "unknown field '", key, "'");
  }
  return c;
}

std::string TrainConfig::to_json() const {
  json j = json::object();
  for_each_field(*this, [&](const char* name, const auto& field) { j[name] = field; });
  return j.dump(2);
}

void TrainConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    MICROLLM_CHECK(v > 0, ValueError, "train config", name, " must be > 0, got ", v);
  };
  positive(batch_size, "batch_size");
  positive(seq_len, "seq_len");
  positive(grad_accum, "grad_accum");
  positive(steps, "steps");
  positive(log_interval, "log_interval");
  MICROLLM_CHECK(!train_data.empty(), ValueError, "train config", "train_data (or data) is not set");
  MICROLLM_CHECK(eval_interval >= 0 && checkpoint_interval >= 0 && eval_batches >= 0 && warmup_steps >= 0, ValueError,
                 "train config", "intervals, eval_batches and warmup_steps must be >= 0");
  MICROLLM_CHECK(clip >= 0, ValueError, "train config", "clip must be >= 0, got ", clip);
  MICROLLM_CHECK(precision == "fp32" || precision == "bf16-mixed", ValueError, "train config",
                 "precision must be fp32 or bf16-mixed, got '", precision, "'");
  MICROLLM_CHECK(optimizer_dtype == "f32" || optimizer_dtype == "bf16", ValueError, "train config",
                 "optimizer_dtype must be f32 or bf16, got '", optimizer_dtype, "'");
  MICROLLM_CHECK(model_type == "llama" || model_type == "qwen2" || model_type == "qwen3", ValueError, "train config",
                 "model_type must be llama, qwen2 or qwen3, got '", model_type, "'");
  MICROLLM_CHECK(distributed == "auto" || distributed == "off" || distributed == "mpi" || distributed == "nccl" ||
                     distributed == "local",
                 ValueError, "train config", "distributed must be auto, off, mpi, nccl or local, got '", distributed,
                 "'");
  MICROLLM_CHECK(bucket_mb > 0, ValueError, "train config", "bucket_mb must be > 0, got ", bucket_mb);
  MICROLLM_CHECK(comm_timeout_seconds > 0, ValueError, "train config", "comm_timeout_seconds must be > 0, got ",
                 comm_timeout_seconds);
  MICROLLM_CHECK(!(overwrite && (resume || resume_if_exists)), ValueError, "train config",
                 "overwrite and resume (or resume_if_exists) exclude each other: overwrite replaces the checkpoint "
                 "that resume continues");
  MICROLLM_CHECK(is_preset(model) || fs::exists(model), ValueError, "train config", "model '", model,
                 "' is neither a preset (tiny, model-s, model-m) nor a path to a Hugging Face config.json (the file, "
                 "or a directory holding it)");
  lr_schedule().validate();
  Device::parse(device);
}

std::vector<std::string> TrainConfig::warnings() const {
  std::vector<std::string> out;
  if (steps < warmup_steps) {
    out.push_back(str_cat("steps ", steps, " is fewer than warmup_steps ", warmup_steps,
                          ": the learning rate stops at ", lr_schedule().at(steps - 1), " and never reaches its peak ",
                          lr, " (lower the warmup or train longer)"));
  }
  return out;
}

std::string TrainConfig::resolved_checkpoint_dir() const {
  return checkpoint_dir.empty() ? (fs::path(out_dir) / "checkpoint").string() : checkpoint_dir;
}

std::string TrainConfig::best_checkpoint_dir() const { return resolved_checkpoint_dir() + "-best"; }

LrSchedule TrainConfig::lr_schedule() const {
  LrSchedule s;
  s.lr = lr;
  s.warmup_steps = warmup_steps;
  s.total_steps = steps;
  s.decay = parse_decay(schedule);
  s.min_ratio = min_lr_ratio;
  return s;
}

// ---- Trainer ----

namespace {
json step_json(const StepMetrics& m) {
  json j = {{"type", "train"},
            {"step", m.step},
            {"loss", m.loss},
            {"lr", m.lr},
            {"grad_norm", m.grad_norm},
            {"tokens_per_second", m.tokens_per_second},
            {"elapsed_seconds", m.elapsed_seconds},
            {"tokens", m.tokens}};
  if (m.comm_timed) {
    j["comm_ms"] = m.comm_ms;
    j["comm_hidden_ms"] = m.comm_hidden_ms;
    j["comm_exposed_ms"] = m.comm_exposed_ms;
  }
  return j;
}

json eval_json(const EvalMetrics& m) {
  return {{"type", "eval"},
          {"step", m.step},
          {"val_loss", m.loss},
          {"val_nats_per_byte", m.nats_per_byte},
          {"seconds", m.seconds}};
}

StepMetrics step_from_json(const json& j) {
  StepMetrics m;
  m.step = j.at("step").get<int64_t>();
  m.loss = j.at("loss").get<double>();
  m.lr = j.at("lr").get<double>();
  m.grad_norm = j.at("grad_norm").get<double>();
  m.tokens_per_second = j.at("tokens_per_second").get<double>();
  m.elapsed_seconds = j.at("elapsed_seconds").get<double>();
  m.tokens = j.at("tokens").get<int64_t>();
  if (j.contains("comm_ms")) {
    m.comm_timed = true;
    m.comm_ms = j.at("comm_ms").get<double>();
    m.comm_hidden_ms = j.value("comm_hidden_ms", 0.0);
    m.comm_exposed_ms = j.value("comm_exposed_ms", 0.0);
  }
  return m;
}

EvalMetrics eval_from_json(const json& j) {
  EvalMetrics m;
  m.step = j.at("step").get<int64_t>();
  m.loss = j.at("val_loss").get<double>();
  m.nats_per_byte = j.at("val_nats_per_byte").get<double>();
  m.seconds = j.value("seconds", 0.0);
  return m;
}

nn::TransformerConfig model_config(const TrainConfig& config, int64_t vocab_size) {
  nn::TransformerConfig c;
  if (is_preset(config.model)) {
    c = nn::TransformerConfig::preset(config.model, vocab_size);
    c.model_type = config.model_type;
    c.attention_bias = config.model_type == "qwen2";
    c.qk_norm = config.model_type == "qwen3";
  } else {
    c = models::read_config_file(config.model);
    MICROLLM_CHECK(c.vocab_size >= vocab_size, ValueError, "train", config.model, " has vocab_size ", c.vocab_size,
                   " but the token files use ids up to ", vocab_size - 1);
  }
  return c;
}

// " at step S of N" from a checkpoint's trainer_state.json, or "" when it cannot be read (for messages only).
std::string checkpoint_progress(const fs::path& dir) {
  try {
    const json state = json::parse(io::read_text_file((dir / "trainer_state.json").string()));
    return str_cat(" at step ", state.at("step").get<int64_t>(), " of ", state.at("config").at("steps").get<int64_t>());
  } catch (const std::exception&) {
    return "";
  }
}

// A fresh run writes `dir`: it must be absent or empty, unless config.overwrite.
void check_replaceable(const TrainConfig& config, const std::string& dir) {
  if (config.overwrite) return;
  const fs::path path(dir);
  MICROLLM_CHECK(!fs::exists(path / "trainer_state.json"), ValueError, "train", dir, " already holds a checkpoint",
                 checkpoint_progress(path),
                 ": set resume to continue it or overwrite to replace it (microllm train --resume or --overwrite)");
  std::error_code ignored;
  MICROLLM_CHECK(!fs::is_directory(path, ignored) || fs::is_empty(path, ignored), ValueError, "train", dir,
                 " holds files but no trainer_state.json (not a checkpoint): set overwrite to replace it (microllm "
                 "train --overwrite) or choose another directory");
}

// Whether the run continues from the checkpoint in config.resolved_checkpoint_dir() (TrainConfig::resume);
// ValueError when the directories and the config disagree.
bool resumes(const TrainConfig& config) {
  const std::string dir = config.resolved_checkpoint_dir();
  const bool has_checkpoint = fs::exists(fs::path(dir) / "trainer_state.json");
  if ((config.resume || config.resume_if_exists) && has_checkpoint) return true;
  MICROLLM_CHECK(!config.resume || config.resume_if_exists, ValueError, "train", "resume: ", dir,
                 " holds no checkpoint (no trainer_state.json) to continue; set resume_if_exists to start afresh when "
                 "there is none (microllm train --resume-if-exists)");
  check_replaceable(config, dir);
  if (config.keep_best) check_replaceable(config, config.best_checkpoint_dir());
  return false;
}

size_t peak_resident_bytes() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<size_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}
}  // namespace

Trainer::Trainer(TrainConfig config) : config_(std::move(config)) {
  config_.validate();
  const bool resume = resumes(config_);  // before anything is built: a refusal comes at once
  if (config_.threads > 0) set_num_threads(config_.threads);
  device_ = Device::parse(config_.device);
  // Data parallelism: one process per device, launched by mpirun or torchrun (docs/DISTRIBUTED.md).
  const distributed::LaunchInfo launch =
      config_.distributed == "off" ? distributed::LaunchInfo{} : distributed::detect_launch();
  const bool data_parallel = config_.distributed != "off" && (launch.world_size > 1 || config_.distributed != "auto");
  if (data_parallel) {
    if (config_.device == "cuda") device_ = Device::cuda(launch.local_rank);  // each process its own GPU
    // Processes sharing a machine share its cores, unless told otherwise.
    if (config_.threads == 0 && std::getenv("OMP_NUM_THREADS") == nullptr && launch.local_world_size > 1)
      set_num_threads(std::max(1, num_threads() / launch.local_world_size));
  }
  MICROLLM_CHECK(!device_.is_cuda() || device_.index < cuda_device_count(), DeviceError, "train", "device ",
                 config_.device, " is not available (", cuda_device_count(), " CUDA devices)");
  compute_dtype_ = config_.precision == "bf16-mixed" ? DType::bf16 : DType::f32;
  if (data_parallel) {
    comm_ = distributed::create_communicator(
        {.backend = config_.distributed, .device = device_, .timeout_seconds = config_.comm_timeout_seconds});
    MICROLLM_CHECK(config_.batch_size % comm_->world_size() == 0, ValueError, "train", "batch_size ",
                   config_.batch_size, " (the global batch) is not divisible by the world size ", comm_->world_size());
  }
  train_file_ = std::make_unique<TokenFile>(TokenFile::open(config_.train_data));
  const auto vocab = static_cast<int64_t>(train_file_->info().vocab_size);
  if (!config_.val_data.empty()) {
    val_file_ = std::make_unique<TokenFile>(TokenFile::open(config_.val_data));
    MICROLLM_CHECK(val_file_->info().vocab_size == train_file_->info().vocab_size, ValueError, "train",
                   config_.val_data, " has vocab size ", val_file_->info().vocab_size, " but ", config_.train_data,
                   " has ", vocab);
    if (config_.eval_batches > 0) {
      val_batches_ = validation_batches(*val_file_, config_.batch_size, config_.seq_len, config_.eval_batches);
      for (Batch& b : val_batches_) b = {b.ids.to(device_), b.targets.to(device_)};
    }
  }
  model_ = std::make_unique<nn::TransformerLM>(model_config(config_, vocab), config_.seed);
  model_->to(device_);
  OptimizerConfig oc;
  oc.type = config_.optimizer;
  oc.beta1 = config_.beta1, oc.beta2 = config_.beta2, oc.eps = config_.eps;
  oc.weight_decay = config_.weight_decay, oc.momentum = config_.momentum;
  oc.state_dtype = parse_dtype(config_.optimizer_dtype);
  if (comm_) {  // gradients averaged over the ranks; with ZeRO-1 this rank's optimizer updates its shard only
    ddp_ = std::make_unique<distributed::DataParallel>(
        model_->named_parameters(), *comm_,
        distributed::DataParallelOptions{
            .bucket_mb = config_.bucket_mb, .zero1 = config_.zero1, .time_collectives = config_.time_collectives});
  }
  optimizer_ = std::make_unique<Optimizer>(ddp_ ? ddp_->optimizer_parameters() : model_->named_parameters(), oc);
  // The sampler's stream differs from the initialization's (which used Generator(seed)).
  sampler_ = std::make_unique<BatchSampler>(*train_file_, config_.batch_size, config_.seq_len,
                                            config_.seed ^ 0x5851F42D4C957F2Dull);
  schedule_ = config_.lr_schedule();
  if (resume) {
    load_checkpoint(config_.resolved_checkpoint_dir());
    resumed_ = true;
  }
}

Trainer::~Trainer() = default;

int Trainer::rank() const { return comm_ ? comm_->rank() : 0; }
int Trainer::world_size() const { return comm_ ? comm_->world_size() : 1; }

void Trainer::zero_grad() {
  optimizer_->zero_grad();
  if (ddp_) ddp_->zero_grad();
}

bool Trainer::stop_requested() {
  if (!comm_) return interrupt_requested();
  return comm_->all_reduce_scalar(interrupt_requested() ? 1 : 0) > 0;  // every rank stops after the same step
}

double Trainer::train_seconds() {
  const double seconds = seconds_before_ + now_seconds() - run_clock_;
  return comm_ ? comm_->all_reduce_scalar(seconds, distributed::ReduceOp::avg) : seconds;  // one clock for all
}

void Trainer::train_step() {
  const int device = device_.is_cuda() ? device_.index : -1;
  profile::Scope span("train.step", "step");
  profile::GpuScope gpu_span("train.step", "step", device);
  nn::ForwardContext ctx;
  ctx.compute_dtype = compute_dtype_;
  zero_grad();
  const int64_t rows = config_.batch_size / world_size(), first_row = rows * rank();
  for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
    Batch batch = sampler_->next();  // the global batch: every rank draws it and trains on its rows
    if (ddp_) {
      batch = {batch.ids.narrow(0, first_row, rows), batch.targets.narrow(0, first_row, rows)};
      ddp_->set_sync(micro + 1 == config_.grad_accum);  // gradients travel after the last micro-batch only
    }
    const Tensor ids = batch.ids.to(device_), targets = batch.targets.to(device_);
    autograd::Variable loss;
    {
      profile::Scope forward("train.forward", "step");
      profile::GpuScope gpu_forward("train.forward", "step", device);
      MemoryCategoryScope memory(MemoryCategory::activations);
      loss = model_->loss(ids, targets, ctx);
    }
    {
      profile::Scope backward("train.backward", "step");
      profile::GpuScope gpu_backward("train.backward", "step", device);
      MemoryCategoryScope memory(MemoryCategory::gradients);
      // Each micro-batch's mean loss weighs 1 / grad_accum: the gradients add up to those of the mean
      // over every micro-batch.
      (config_.grad_accum > 1 ? autograd::scale(loss, 1.0 / static_cast<double>(config_.grad_accum)) : loss).backward();
    }
    loss_sum_ = loss_sum_.defined() ? add(loss_sum_, loss.value()) : loss.value();
    ++loss_count_;
    tokens_ += config_.batch_size * config_.seq_len;
  }
  if (ddp_) {
    profile::Scope all_reduce("train.all_reduce", "step");
    ddp_->finish_gradients();  // every gradient is now the mean over the ranks
  }
  profile::Scope optimizer("train.optimizer", "step");
  profile::GpuScope gpu_optimizer("train.optimizer", "step", device);
  MemoryCategoryScope memory(MemoryCategory::optimizer_state);
  const std::vector<nn::ParameterInfo>& params = optimizer_->parameters();
  last_grad_norm_ = ddp_ ? ddp_->gradient_norm() : gradient_norm(params);
  const Tensor scale = config_.clip > 0 ? clip_coefficient(last_grad_norm_, config_.clip) : Tensor();
  int64_t schedule_step = optimizer_->steps();
  if (config_.max_seconds > 0) {  // a timed run: the schedule advances with the time spent
    const double spent = train_seconds() / config_.max_seconds;
    schedule_step = std::max(schedule_step, static_cast<int64_t>(spent * static_cast<double>(config_.steps)));
  }
  optimizer_->step(schedule_.at(std::min(schedule_step, config_.steps - 1)), scale);
  if (ddp_) ddp_->after_step();  // ZeRO-1: all-gathers the updated parameters
  zero_grad();
}

EvalMetrics Trainer::evaluate() {
  const double start = now_seconds();
  EvalMetrics m;
  m.step = step();
  if (val_batches_.empty()) return m;
  autograd::NoGradGuard no_grad;
  nn::ForwardContext ctx;
  ctx.compute_dtype = compute_dtype_;
  Tensor sum;
  for (size_t i = static_cast<size_t>(rank()); i < val_batches_.size(); i += static_cast<size_t>(world_size())) {
    const Tensor loss = model_->loss(val_batches_[i].ids, val_batches_[i].targets, ctx).value();
    sum = sum.defined() ? add(sum, loss) : loss;
  }
  double total = sum.defined() ? sum.item<double>() : 0;
  if (comm_) total = comm_->all_reduce_scalar(total);  // each rank evaluated every world_size-th batch
  m.loss = total / static_cast<double>(val_batches_.size());
  m.nats_per_byte = m.loss / val_file_->bytes_per_token();
  m.seconds = now_seconds() - start;
  return m;
}

StepMetrics Trainer::flush_log() {
  StepMetrics m;
  m.step = step();
  m.lr = schedule_.at(std::max<int64_t>(0, step() - 1));
  m.loss = loss_count_ > 0 ? loss_sum_.item<double>() / static_cast<double>(loss_count_) : 0;  // waits for the device
  if (comm_) m.loss = comm_->all_reduce_scalar(m.loss, distributed::ReduceOp::avg);  // over every rank's rows
  m.grad_norm = last_grad_norm_.defined() ? last_grad_norm_.item<double>() : 0;
  const double now = now_seconds();
  m.tokens = tokens_;
  m.tokens_per_second = static_cast<double>(tokens_ - tokens_at_log_) / std::max(1e-9, now - log_clock_);
  m.elapsed_seconds = seconds_before_ + (now - run_clock_);
  if (ddp_ && config_.time_collectives) {
    const distributed::CollectiveTiming t = ddp_->take_timing();
    if (t.steps > 0) {
      const double per_step_ms = 1e3 / static_cast<double>(t.steps);
      m.comm_timed = true;
      m.comm_ms = t.seconds * per_step_ms;
      m.comm_hidden_ms = t.hidden_seconds * per_step_ms;
      m.comm_exposed_ms = t.exposed_seconds * per_step_ms;
    }
  }
  log_clock_ = now;
  tokens_at_log_ = tokens_;
  loss_sum_ = Tensor();
  loss_count_ = 0;
  return m;
}

void Trainer::write_metrics_line(const std::string& line) {
  if (rank() != 0) return;
  std::ofstream out(fs::path(config_.out_dir) / "metrics.jsonl", std::ios::app);
  if (!out) throw IoError(config_.out_dir, "cannot append to metrics.jsonl");
  out << line << "\n";
}

void Trainer::write_loss_curve() const {
  if (comm_ && comm_->rank() != 0) return;
  Series train{"train loss", "#1f77b4", {}}, val{"val loss", "#d62728", {}};
  for (const StepMetrics& m : train_history_) train.points.emplace_back(static_cast<double>(m.step), m.loss);
  for (const EvalMetrics& m : eval_history_) val.points.emplace_back(static_cast<double>(m.step), m.loss);
  const std::string title = str_cat(config_.model, " on ", fs::path(config_.train_data).filename().string());
  io::write_text_atomically((fs::path(config_.out_dir) / "loss.svg").string(),
                            line_chart_svg({train, val}, title, "step", "loss (nats/token)"));
}

TrainResult Trainer::run(const TrainCallbacks& callbacks) {
  if (world_size() == 1) return run_loop(callbacks);
  try {
    return run_loop(callbacks);
  } catch (const std::exception& e) {
    // The other ranks would wait for this one at their next collective: end the whole job instead.
    distributed::abort_job(str_cat("train: ", e.what()));
  }
}

TrainResult Trainer::run_loop(const TrainCallbacks& callbacks) {
  SigintGuard sigint;
  clear_interrupt();
  fs::create_directories(config_.out_dir);
  if (rank() == 0) {  // metrics.jsonl holds this run's history: rewritten from the checkpoint's when resuming
    std::ofstream out(fs::path(config_.out_dir) / "metrics.jsonl", std::ios::trunc);
    if (!out) throw IoError(config_.out_dir, "cannot write metrics.jsonl");
    for (const StepMetrics& m : train_history_) out << step_json(m).dump() << "\n";
    for (const EvalMetrics& m : eval_history_) out << eval_json(m).dump() << "\n";
  }
  TrainResult result;
  const std::string dir = config_.resolved_checkpoint_dir();
  run_clock_ = log_clock_ = now_seconds();
  tokens_at_log_ = tokens_;
  auto log = [&]() {
    const StepMetrics m = flush_log();
    train_history_.push_back(m);
    write_metrics_line(step_json(m).dump());
    if (callbacks.on_log) callbacks.on_log(m);
  };
  auto eval = [&]() {
    if (val_batches_.empty()) return;
    const EvalMetrics m = evaluate();
    const bool improved = std::all_of(eval_history_.begin(), eval_history_.end(),
                                      [&](const EvalMetrics& earlier) { return m.loss < earlier.loss; });
    eval_history_.push_back(m);
    result.last_eval = m;
    write_metrics_line(eval_json(m).dump());
    if (callbacks.on_eval) callbacks.on_eval(m);
    if (config_.keep_best && improved) {
      save_checkpoint(config_.best_checkpoint_dir());
      if (callbacks.on_checkpoint) callbacks.on_checkpoint(config_.best_checkpoint_dir());
    }
  };
  auto save = [&]() {
    save_checkpoint(dir);
    result.checkpoint_dir = dir;
    if (callbacks.on_checkpoint) callbacks.on_checkpoint(dir);
  };
  while (step() < config_.steps) {
    train_step();
    const int64_t s = step();
    if (callbacks.on_step) callbacks.on_step(s);
    const bool out_of_time = config_.max_seconds > 0 && train_seconds() >= config_.max_seconds;
    const bool last = s == config_.steps || out_of_time;
    if (s % config_.log_interval == 0 || last) log();
    if ((config_.eval_interval > 0 && s % config_.eval_interval == 0) || last) eval();
    if (stop_requested()) {
      if (loss_count_ > 0) log();
      save();
      result.interrupted = true;
      break;
    }
    if (last || (config_.checkpoint_interval > 0 && s % config_.checkpoint_interval == 0)) save();
    if (out_of_time) break;
  }
  result.steps = step();
  result.seconds = now_seconds() - run_clock_;
  if (device_.is_cuda()) result.peak_device_bytes = cuda::allocator_stats(device_.index).peak_allocated_bytes;
  std::vector<double> peaks(static_cast<size_t>(world_size()), 0.0);
  peaks[static_cast<size_t>(rank())] =
      static_cast<double>(device_.is_cuda() ? result.peak_device_bytes : peak_resident_bytes());
  if (comm_) {  // every rank's peak, for the report
    const Tensor all = Tensor::from_vector(peaks, {world_size()}, comm_->device());
    comm_->all_reduce(all);
    peaks = all.to_vector<double>();
  }
  for (double p : peaks) result.peak_bytes_per_rank.push_back(static_cast<size_t>(p));
  if (result.checkpoint_dir.empty() && resumed_) result.checkpoint_dir = dir;  // it was already at config.steps
  if (!result.last_eval && !eval_history_.empty()) result.last_eval = eval_history_.back();
  write_loss_curve();
  clear_interrupt();
  return result;
}

void Trainer::save_checkpoint(const std::string& dir) {
  const double elapsed = seconds_before_ + (run_clock_ > 0 ? now_seconds() - run_clock_ : 0);
  // The optimizer state as one process would hold it (ZeRO-1 gathers the shards: every rank takes part),
  // so that the checkpoint loads at any world size. Rank 0 writes; the others wait until it is complete.
  const std::vector<std::pair<std::string, Tensor>> optimizer_state =
      ddp_ ? ddp_->gather_optimizer_state(optimizer_->state()) : optimizer_->state();
  if (rank() != 0) {
    comm_->barrier();
    return;
  }
  write_directory_atomically(dir, [&](const std::string& tmp) {
    models::save_model(*model_, tmp);
    io::save_safetensors((fs::path(tmp) / "optimizer.safetensors").string(), optimizer_state,
                         {{"optimizer", config_.optimizer}, {"step", std::to_string(step())}});
    json state;
    state["format"] = "microllm-trainer-state";
    state["version"] = 1;
    state["step"] = step();
    state["tokens"] = tokens_;
    state["seconds"] = elapsed;
    state["generators"] = {
        {"sampler", {{"seed", sampler_->generator().seed()}, {"offset", sampler_->generator().offset()}}}};
    state["data"] = {{"train", config_.train_data},
                     {"val", config_.val_data},
                     {"batches_drawn", sampler_->batches_drawn()},
                     {"tokenizer", train_file_->info().tokenizer}};
    state["config"] = json::parse(config_.to_json());
    state["schedule"] = {{"lr", schedule_.lr},
                         {"warmup_steps", schedule_.warmup_steps},
                         {"total_steps", schedule_.total_steps},
                         {"decay", decay_name(schedule_.decay)},
                         {"min_ratio", schedule_.min_ratio}};
    json train = json::array(), val = json::array();
    for (const StepMetrics& m : train_history_) train.push_back(step_json(m));
    for (const EvalMetrics& m : eval_history_) val.push_back(eval_json(m));
    state["metrics"] = {{"train", train}, {"eval", val}};
    io::write_text_atomically((fs::path(tmp) / "trainer_state.json").string(), state.dump(2) + "\n");
    // The Hugging Face tokenizer, so that generate (and transformers) decode with it: the configured one,
    // or the copy `prepare` left beside the token files.
    fs::path source;
    if (!config_.tokenizer.empty()) {
      source = fs::is_directory(config_.tokenizer) ? fs::path(config_.tokenizer) / "tokenizer.json"
                                                   : fs::path(config_.tokenizer);
    } else if (train_file_->info().tokenizer.starts_with("hf:")) {
      std::string prefix = config_.train_data;
      if (prefix.ends_with(".train.bin")) prefix.resize(prefix.size() - 10);
      if (fs::exists(prefix + ".tokenizer.json")) source = prefix + ".tokenizer.json";
    }
    if (!source.empty()) {
      fs::copy_file(source, fs::path(tmp) / "tokenizer.json", fs::copy_options::overwrite_existing);
      const fs::path tokenizer_config = source.parent_path() / "tokenizer_config.json";
      if (!config_.tokenizer.empty() && fs::exists(tokenizer_config)) {
        fs::copy_file(tokenizer_config, fs::path(tmp) / "tokenizer_config.json", fs::copy_options::overwrite_existing);
      }
    }
  });
  if (comm_) comm_->barrier();
}

void Trainer::load_checkpoint(const std::string& dir) {
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  const json state = detail::parse_json(io::read_text_file(state_path), state_path, "not JSON");
  // The checkpoint's model must be this model.
  const nn::TransformerConfig saved = models::read_config_file(dir);
  MICROLLM_CHECK(models::write_config(saved) == models::write_config(model_->config()), ValueError, dir,
                 "the checkpoint's config.json describes another model than this config builds");
  try {
    // Into the masters where they are (device, f32), every tensor present: a strict load.
    models::load_weights(*model_, io::SafetensorsCheckpoint::open(dir),
                         {model_->named_parameters().front().variable->device(), DType::f32, true});
    const io::SafetensorsFile opt = io::SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string());
    const std::function<Tensor(const std::string&)> get = [&](const std::string& name) { return opt.get(name); };
    optimizer_->load_state(ddp_ ? ddp_->shard_state_getter(get) : get);  // ZeRO-1: this rank's slices
    const int64_t saved_step = state.at("step").get<int64_t>();
    MICROLLM_CHECK(saved_step == optimizer_->steps(), ParseError, state_path, "step ", saved_step,
                   " differs from the optimizer's ", optimizer_->steps());
    const json& gen = state.at("generators").at("sampler");
    sampler_->set_state(gen.at("seed").get<uint64_t>(), gen.at("offset").get<uint64_t>(),
                        state.at("data").at("batches_drawn").get<int64_t>());
    tokens_ = state.at("tokens").get<int64_t>();
    seconds_before_ = state.value("seconds", 0.0);
    train_history_.clear();
    eval_history_.clear();
    for (const json& m : state.at("metrics").at("train")) train_history_.push_back(step_from_json(m));
    for (const json& m : state.at("metrics").at("eval")) eval_history_.push_back(eval_from_json(m));
  } catch (const json::exception& e) {
    throw ParseError(state_path, str_cat("malformed trainer state: ", e.what()));
  }
}

}  // namespace microllm::train
