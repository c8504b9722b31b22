// `microllm bench`: a llama-bench-style table of prefill and decode speed (docs/SERVING.md, issue 6).
//   microllm bench --model DIR | --preset NAME | --config CONFIG.json [--device cpu|cuda] [--dtype f32|bf16]
//                  [-p 512,2048] [-n 128] [-b 1,8,32] [--workload 2048:2:64] [-r 3] [--json FILE]
//                  [--path engine|plain] [--prefill-chunk 4096]
// One row per test, tokens/s as min / median / max over the repetitions (after --warmup untimed ones):
//   ppP       prefill: P random prompt tokens per sequence (batch from --prefill-batch, 1) and one new token;
//   tgN       decode: N new tokens per sequence from a one-token prompt at each batch of -b, greedy;
//   ppP+tgN   a workload --workload P:B:N: B prompts of P tokens, each decoded until it has N new tokens,
//             end to end; tokens/s counts the B x N generated tokens (the JSON also has prompt + generated).
// --path engine (the default) runs each repetition as requests to a generate::Engine, the serving path:
// paged KV cache, prefill forwards of at most --prefill-chunk tokens (whole prompts batched), decode steps
// replayed from CUDA graphs, sampling on the device. --path plain runs TransformerLM::forward over a contiguous
// KvCache, the ids of each step chosen by argmax on the device and copied to the host (the loop before the
// engine, kept for comparison).
// The device is synchronized at the end of every timed repetition; KV caches are allocated before the clock
// starts (an engine's CUDA graphs are captured in the warm-up). --preset and --config build the model with
// random weights (no checkpoint needed). A test given on the command line that cannot run (longer than the
// model's window, more memory than the device has) is an error; a default one is skipped with a note.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "microllm/autograd/variable.h"
#include "microllm/backend/kernel_choices.h"
#include "microllm/backend/op_timing.h"
#include "microllm/core/cuda.h"
#include "microllm/core/threads.h"
#include "microllm/generate/engine.h"
#include "microllm/generate/runner.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "microllm/nn/transformer.h"
#include "microllm/ops/reduce.h"
#include "trace_file.h"

namespace microllm::app {
namespace {

namespace fs = std::filesystem;

struct BenchCliOptions {
  std::string model, preset, config;
  std::string trace;    // --trace FILE: the timed repetitions
  int64_t vocab = 256;  // presets only
  uint64_t seed = 0;
  std::string device = "cpu";
  std::string dtype = "f32";
  std::vector<int64_t> prompts{512, 2048};
  std::vector<int64_t> prefill_batches{1};
  std::vector<int64_t> new_tokens{128};
  std::vector<int64_t> batches{1, 8, 32};
  std::vector<std::string> workloads{"2048:2:64"};
  int reps = 3;
  int warmup = 1;
  std::string json;
  int threads = 0;
  std::string path = "engine";   // engine: generate::Engine (paged KV, CUDA graphs); plain: forward + KvCache
  bool op_times = false;         // time every op with CUDA events (graphs off) and print the slowest per test
  bool explain = false;          // print which kernel each fused or dispatching op chose, per test
  int64_t prefill_chunk = 4096;  // the default workload's two 2,048-token prompts in one prefill forward
  // Whether the test lists came from the command line (then a test that cannot run is an error).
  bool prompts_given = false, new_tokens_given = false, batches_given = false, workloads_given = false;
  bool prefill_batches_given = false;
};

enum class Kind { prefill, decode, workload };

struct Test {
  Kind kind;
  std::string name;  // pp512, tg128, pp2048+tg64
  int64_t batch = 1, prompt = 0, generated = 0;
  bool explicit_flag = false;
};

struct Row {
  Test test;
  std::vector<double> seconds;  // one per timed repetition
  std::vector<double> tokens_per_second;
  double tokens = 0;                  // counted tokens per repetition (generated ones for a workload)
  double total_tokens = 0;            // prompt + generated tokens per repetition
  std::vector<OpTiming> op_times;     // --op-times: over the timed repetitions
  std::vector<KernelChoice> kernels;  // --explain: each op's choices over the test's repetitions
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// --explain: the kernel each op chose in each test (CUDA graphs replay what their capture chose).
void print_kernel_choices(std::ostream& out, const std::vector<Row>& rows, Device device) {
  if (!device.is_cuda()) {
    out << "\nkernels: on the CPU every fused op runs its composition of the reference ops (src/backend/fusions.cpp)\n";
  }
  for (const Row& r : rows) {
    if (r.kernels.empty()) continue;
    out << "\nkernels, " << r.test.name << " batch " << r.test.batch
        << " (each op's choice and its host calls; docs/PROFILING.md):\n| op | shapes | kernel | calls |\n| --- | --- "
           "| --- | ---: |\n";
    for (const KernelChoice& k : r.kernels) {
      out << "| " << k.op << " | " << k.shapes << " | " << k.choice << " | " << k.calls << " |\n";
    }
  }
}

void sync(Device device) {
  if (device.is_cuda()) cuda::synchronize(device.index);
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out, arg;
  auto flush = [&] {
    if (!out.empty()) out += ' ';
    const bool quote = arg.empty() || arg.find_first_of(" \t\"'$") != std::string::npos;
    out += quote ? "'" + arg + "'" : arg;
    arg.clear();
  };
  for (char c : all) {
    if (c == '\0') {
      flush();
    } else {
      arg += c;
    }
  }
  if (!arg.empty()) flush();
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        const size_t begin = line.find_first_not_of(" \t", colon + 1);
        if (begin != std::string::npos) return line.substr(begin);
      }
    }
  }
  return "unknown CPU";
}

std::string gibibytes(double bytes) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buffer;
}

std::string format_params(int64_t n) {
  char buffer[32];
  if (n >= 1'000'000'000) {
    std::snprintf(buffer, sizeof buffer, "%.2f B", static_cast<double>(n) / 1e9);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.2f M", static_cast<double>(n) / 1e6);
  }
  return buffer;
}

std::string format_rate(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f", v);
  return buffer;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "2048:2:64" -> a workload test.
Test parse_workload(const std::string& text, bool given) {
  std::vector<int64_t> parts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ':')) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MICROLLM_CHECK(used > 0 && used == item.size(), ValueError, "bench", "--workload '", text,
                   "': expected PROMPT:BATCH:NEW_TOKENS, e.g. 2048:2:64");
    parts.push_back(value);
  }
  MICROLLM_CHECK(parts.size() == 3, ValueError, "bench", "--workload '", text,
                 "': expected PROMPT:BATCH:NEW_TOKENS, e.g. 2048:2:64");
  MICROLLM_CHECK(parts[0] >= 1 && parts[1] >= 1 && parts[2] >= 1, ValueError, "bench", "--workload '", text,
                 "': the prompt, batch and new tokens must all be >= 1");
  return Test{Kind::workload, str_cat("pp", parts[0], "+tg", parts[2]), parts[1], parts[0], parts[2], given};
}

std::vector<Test> make_tests(const BenchCliOptions& o) {
  std::vector<Test> tests;
  for (int64_t b : o.prefill_batches) {
    MICROLLM_CHECK(b >= 1, ValueError, "bench", "--prefill-batch: batch ", b, " must be >= 1");
  }
  for (int64_t b : o.batches) MICROLLM_CHECK(b >= 1, ValueError, "bench", "-b: batch ", b, " must be >= 1");
  for (int64_t p : o.prompts) {
    MICROLLM_CHECK(p >= 0, ValueError, "bench", "-p: prompt length ", p, " must be >= 0 (0: no prefill test)");
    if (p == 0) continue;
    for (int64_t b : o.prefill_batches) {
      tests.push_back(Test{Kind::prefill, str_cat("pp", p), b, p, 0, o.prompts_given || o.prefill_batches_given});
    }
  }
  for (int64_t n : o.new_tokens) {
    MICROLLM_CHECK(n >= 0, ValueError, "bench", "-n: token count ", n, " must be >= 0 (0: no decode test)");
    if (n == 0) continue;
    for (int64_t b : o.batches) {
      tests.push_back(Test{Kind::decode, str_cat("tg", n), b, 0, n, o.new_tokens_given || o.batches_given});
    }
  }
  for (const std::string& w : o.workloads) {
    if (w == "none" || w.empty()) continue;
    tests.push_back(parse_workload(w, o.workloads_given));
  }
  return tests;
}

// Why `test` cannot run on this model and device, or "" when it can.
std::string why_not(const Test& t, const nn::TransformerConfig& c, DType dtype, Device device, size_t weight_bytes) {
  const int64_t window = c.context_limit();
  int64_t positions = 0, cached = 0, logits_rows = 0;
  switch (t.kind) {
    case Kind::prefill:
      positions = cached = t.prompt;
      logits_rows = t.batch * t.prompt;
      break;
    case Kind::decode:
      positions = cached = t.generated;  // tokens at positions 0 .. N-1 are fed
      logits_rows = t.batch;
      break;
    case Kind::workload:
      positions = cached = t.prompt + t.generated - 1;  // the last new token is never fed back
      logits_rows = t.batch * t.prompt;
      break;
  }
  if (positions > window) {
    return str_cat(t.name, " at batch ", t.batch, " needs ", positions, " positions; the model's window (",
                   "max_position_embeddings, or longrope's original) is ", window);
  }
  const double element = static_cast<double>(dtype_size(dtype));
  const double kv = 2.0 * static_cast<double>(c.num_layers) * static_cast<double>(t.batch) *
                    static_cast<double>(c.num_kv_heads) * static_cast<double>(cached) *
                    static_cast<double>(c.resolved_head_dim()) * element;
  const double logits = static_cast<double>(logits_rows) * static_cast<double>(c.vocab_size) * element;
  // Activations of one layer at a time, a few hidden- and intermediate-sized buffers per token.
  const double activations =
      4.0 * static_cast<double>(logits_rows) * static_cast<double>(c.hidden_size + c.intermediate_size) * element;
  double available = 0;
  if (device.is_cuda()) {
    available = static_cast<double>(cuda::device_properties(device.index).total_memory);
  } else {
    available = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  }
  const double need = kv + logits + activations + static_cast<double>(weight_bytes);
  if (available > 0 && need > available) {
    return str_cat(t.name, " at batch ", t.batch, " needs about ", gibibytes(need), " (KV cache ", gibibytes(kv),
                   ", logits ", gibibytes(logits), ", weights ", gibibytes(static_cast<double>(weight_bytes)), "); ",
                   device.str(), " has ", gibibytes(available));
  }
  return "";
}

class Bench {
 public:
  Bench(const nn::TransformerLM& model, Device device, DType dtype, uint64_t seed)
      : runner_(model, dtype), config_(model.config()), device_(device), dtype_(dtype), rng_(seed) {}

  // Random ids in [0, vocab).
  std::vector<int64_t> random_ids(int64_t count) {
    std::uniform_int_distribution<int64_t> pick(0, config_.vocab_size - 1);
    std::vector<int64_t> ids(static_cast<size_t>(count));
    for (int64_t& id : ids) id = pick(rng_);
    return ids;
  }

  // One repetition of `t` through a serving engine, in seconds: B requests submitted at once (a decode test's
  // prompts are one random token, so decoding starts at once), run until all finish. Greedy, no stop ids.
  double run_engine(const Test& t, generate::Engine& engine) {
    std::vector<generate::EngineRequest> requests(static_cast<size_t>(t.batch));
    for (generate::EngineRequest& r : requests) {
      const std::vector<int64_t> ids = random_ids(t.kind == Kind::decode ? 1 : t.prompt);
      r.prompt.assign(ids.begin(), ids.end());
      r.max_new_tokens = t.kind == Kind::prefill ? 1 : t.generated;
      r.sampling.temperature = 0;
    }
    sync(device_);
    const auto start = std::chrono::steady_clock::now();
    for (generate::EngineRequest& r : requests) engine.submit(std::move(r));
    engine.run_until_idle();
    sync(device_);
    return seconds_since(start);
  }

  // One repetition of `t`, in seconds; the cache is allocated by the caller, reset here.
  double run(const Test& t, generate::ContiguousKvCache& cache) {
    cache.reset();
    const std::vector<int64_t> host_ids = random_ids(t.kind == Kind::decode ? t.batch : t.batch * t.prompt);
    sync(device_);
    const auto start = std::chrono::steady_clock::now();
    if (t.kind == Kind::prefill) {
      const Tensor ids = Tensor::from_vector(host_ids, {t.batch, t.prompt}, device_);
      const Tensor logits = runner_.forward(ids, cache);
      (void)logits;
      sync(device_);
      return seconds_since(start);
    }
    Tensor ids = t.kind == Kind::decode ? Tensor::from_vector(host_ids, {t.batch, 1}, device_)
                                        : Tensor::from_vector(host_ids, {t.batch, t.prompt}, device_);
    // N forwards make N new tokens per sequence: a decode test feeds a random first token and then N - 1
    // chosen ones; a workload's prefill chooses the first new token, then N - 1 single-token steps follow.
    for (int64_t step = 0;; ++step) {
      const Tensor logits = runner_.forward(ids, cache);  // [B, T, vocab]
      const std::vector<int64_t> next =
          argmax(logits.select(1, logits.size(1) - 1), -1).to_vector<int64_t>();  // B ids to the host
      if (step + 1 == t.generated) break;
      ids = Tensor::from_vector(next, {t.batch, 1}, device_);
    }
    sync(device_);
    return seconds_since(start);
  }

 private:
  generate::Runner runner_;  // --path plain: the model's weights through a contiguous KV cache
  const nn::TransformerConfig& config_;
  Device device_;
  DType dtype_;
  std::mt19937_64 rng_;
};

void run_bench(const BenchCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const int sources = !o.model.empty() + !o.preset.empty() + !o.config.empty();
  MICROLLM_CHECK(sources == 1, ValueError, "bench", "give exactly one of --model DIR, --preset NAME, --config FILE");
  const Device device = Device::parse(o.device);
  const DType dtype = parse_dtype(o.dtype);
  MICROLLM_CHECK(dtype == DType::f32 || dtype == DType::bf16, ValueError, "bench", "--dtype must be f32 or bf16, got ",
                 o.dtype);
  if (device.is_cuda()) {
    MICROLLM_CHECK(device.index < cuda_device_count(), DeviceError, "bench", "--device ", o.device, ": this ",
                   cuda_device_count() == 0 ? "build or machine has no CUDA device" : "machine has fewer devices");
  }
  MICROLLM_CHECK(o.reps >= 1, ValueError, "bench", "-r must be >= 1, got ", o.reps);
  MICROLLM_CHECK(o.warmup >= 0, ValueError, "bench", "--warmup must be >= 0, got ", o.warmup);
  std::vector<Test> tests = make_tests(o);
  MICROLLM_CHECK(!tests.empty(), ValueError, "bench", "no test to run (-p, -n and --workload are all off)");

  // The model: a checkpoint directory, or random weights from a preset or a config.json.
  std::string model_name, source;
  std::unique_ptr<nn::TransformerLM> model;
  const auto load_start = std::chrono::steady_clock::now();
  if (!o.model.empty()) {
    models::LoadOptions load;
    load.device = device;
    load.dtype = dtype;
    model = models::load_model(o.model, load).model;
    fs::path dir = fs::path(o.model).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();  // "models/qwen/"
    model_name = dir.filename().string();
    source = "checkpoint " + o.model;
  } else {
    nn::TransformerConfig config;
    if (!o.preset.empty()) {
      MICROLLM_CHECK(o.vocab >= 1, ValueError, "bench", "--vocab must be >= 1, got ", o.vocab);
      config = nn::TransformerConfig::preset(o.preset, o.vocab);
      model_name = o.preset;
    } else {
      config = models::read_config_file(o.config);
      const fs::path path(o.config);
      fs::path dir = path.lexically_normal();
      if (dir.filename().empty()) dir = dir.parent_path();
      model_name = fs::is_directory(path) ? dir.filename().string() : path.stem().string();
      if (model_name.empty()) model_name = o.config;
    }
    model = std::make_unique<nn::TransformerLM>(config, o.seed, true);
    model->to(device);
    model->to(dtype);
    source = str_cat("random weights, seed ", o.seed);
  }
  model->fuse_projections();
  sync(device);
  const double load_seconds = seconds_since(load_start);
  const nn::TransformerConfig& config = model->config();
  size_t weight_bytes = 0;
  for (const nn::ParameterInfo& p : model->named_parameters()) weight_bytes += p.variable->value().nbytes();

  // Every test is checked before any runs: an explicit one that cannot run is an error, a default one a note.
  std::vector<std::pair<Test, std::string>> skipped;
  std::vector<Test> runnable;
  for (const Test& t : tests) {
    const std::string reason = why_not(t, config, dtype, device, weight_bytes);
    if (reason.empty()) {
      runnable.push_back(t);
    } else {
      MICROLLM_CHECK(!t.explicit_flag, ValueError, "bench", reason);
      skipped.emplace_back(t, reason);
    }
  }
  MICROLLM_CHECK(!runnable.empty(), ValueError, "bench", "no test fits this model: ", skipped.front().second);

  const std::string command = command_line();
  const std::string cpu = cpu_model();
  std::string gpu;
  if (device.is_cuda()) {
    const cuda::DeviceProperties props = cuda::device_properties(device.index);
    gpu = str_cat(props.name, " (", gibibytes(static_cast<double>(props.total_memory)), ", sm_", props.major,
                  props.minor, ", ", props.multiprocessors, " SMs)");
  }

  const bool progress = isatty(STDERR_FILENO);
  if (o.op_times) set_op_timing(true);
  set_recording_kernel_choices(o.explain);
  autograd::NoGradGuard no_grad;
  Bench bench(*model, device, dtype, o.seed + 1);
  std::vector<Row> rows;
  TraceFile trace(o.trace);
  for (const Test& t : runnable) {
    const int64_t capacity = t.kind == Kind::prefill  ? t.prompt
                             : t.kind == Kind::decode ? t.generated
                                                      : t.prompt + t.generated - 1;
    std::unique_ptr<generate::ContiguousKvCache> cache;
    std::unique_ptr<generate::Engine> engine;
    if (o.path == "engine") {
      generate::EngineOptions e;
      e.max_batch = t.batch;
      e.dtype = dtype;
      e.prefill_chunk = o.prefill_chunk;
      e.kv_blocks = t.batch * ((capacity + 1 + e.block_size - 1) / e.block_size);
      e.cuda_graphs = !o.op_times;  // events cannot bracket the ops of a replayed graph
      engine = std::make_unique<generate::Engine>(*model, e);
    } else {
      cache =
          std::make_unique<generate::ContiguousKvCache>(config, t.batch, std::max<int64_t>(capacity, 1), dtype, device);
    }
    Row row{t, {}, {}, 0, 0, {}, {}};
    clear_kernel_choices();
    row.tokens = static_cast<double>(t.batch * (t.kind == Kind::prefill ? t.prompt : t.generated));
    row.total_tokens = static_cast<double>(t.batch * (t.prompt + t.generated));
    for (int i = 0; i < o.warmup + o.reps; ++i) {
      if (progress) {
        std::cerr << "\rbench: " << t.name << " batch " << t.batch << (i < o.warmup ? " warm-up" : " rep ")
                  << (i < o.warmup ? std::string() : std::to_string(i - o.warmup + 1)) << "   " << std::flush;
      }
      if (o.op_times && i == o.warmup) reset_op_timings();
      const double s = engine ? bench.run_engine(t, *engine) : bench.run(t, *cache);
      if (i < o.warmup) continue;
      row.seconds.push_back(s);
      row.tokens_per_second.push_back(s > 0 ? row.tokens / s : 0);
    }
    if (o.op_times) row.op_times = op_timings();
    row.kernels = kernel_choices();
    rows.push_back(std::move(row));
  }
  trace.finish();
  if (progress) std::cerr << "\r\033[K" << std::flush;

  // The report: what ran where, then the table.
  std::ostringstream out;
  out << "command: " << command << "\n";
  out << "machine: CPU " << cpu << ", " << num_threads() << " threads";
  if (!gpu.empty()) out << "; GPU " << gpu;
  out << "\n";
  out << "model: " << model_name << " (" << source << "), " << config.model_type << ", " << config.num_layers
      << " layers, hidden " << config.hidden_size << ", vocab " << config.vocab_size << ", window "
      << config.max_position_embeddings << "; ready in " << format_rate(load_seconds) << " s\n";
  out << "repetitions: " << o.reps << " timed after " << o.warmup << " warm-up; path: " << o.path
      << (o.path == "engine" ? str_cat(" (generate::Engine, paged KV cache, prefill chunk ", o.prefill_chunk,
                                       device.is_cuda() ? ", CUDA graphs)" : ")")
                             : " (generate::Runner over a contiguous KV cache)")
      << "\n\n";
  out << "| model | params | device | dtype | batch | test | t/s min | t/s median | t/s max |\n";
  out << "| --- | ---: | --- | --- | ---: | --- | ---: | ---: | ---: |\n";
  const std::string params = format_params(config.num_parameters());
  bool any_workload = false;
  for (const Row& r : rows) {
    const auto [lo, hi] = std::minmax_element(r.tokens_per_second.begin(), r.tokens_per_second.end());
    out << "| " << model_name << " | " << params << " | " << device.str() << " | " << o.dtype << " | " << r.test.batch
        << " | " << r.test.name << " | " << format_rate(*lo) << " | " << format_rate(median(r.tokens_per_second))
        << " | " << format_rate(*hi) << " |\n";
    any_workload = any_workload || r.test.kind == Kind::workload;
  }
  if (any_workload) {
    out << "\nppP+tgN: prefill then decode end to end; t/s counts the batch x N generated tokens.\n";
  }
  for (const auto& [t, reason] : skipped) out << "skipped (a default test): " << reason << "\n";
  for (const Row& r : rows) {  // --op-times: where the time of each test goes
    if (r.op_times.empty()) continue;
    double total = 0;
    for (const OpTiming& op : r.op_times) total += op.total_ms;
    out << "\nop times, " << r.test.name << " batch " << r.test.batch << " (per repetition; GPU time "
        << format_rate(total / o.reps) << " ms of " << format_rate(1e3 * median(r.seconds))
        << " ms wall):\n| op | calls | ms | share |\n| --- | ---: | ---: | ---: |\n";
    for (size_t i = 0; i < r.op_times.size() && i < 12; ++i) {
      const OpTiming& op = r.op_times[i];
      out << "| " << op.op << " | " << op.calls / o.reps << " | " << format_rate(op.total_ms / o.reps) << " | "
          << format_rate(100 * op.total_ms / total) << "% |\n";
    }
  }
  if (o.explain) print_kernel_choices(out, rows, device);
  std::cout << out.str() << std::flush;

  if (!o.json.empty()) {
    nlohmann::json report;
    report["command"] = command;
    report["machine"] = {{"cpu", cpu}, {"threads", num_threads()}, {"gpu", gpu}};
    report["model"] = {{"name", model_name},
                       {"source", source},
                       {"model_type", config.model_type},
                       {"parameters", config.num_parameters()},
                       {"vocab_size", config.vocab_size},
                       {"max_position_embeddings", config.max_position_embeddings}};
    report["device"] = device.str();
    report["dtype"] = o.dtype;
    report["repetitions"] = o.reps;
    report["path"] = o.path;
    report["warmup"] = o.warmup;
    report["rows"] = nlohmann::json::array();
    for (const Row& r : rows) {
      const auto [lo, hi] = std::minmax_element(r.tokens_per_second.begin(), r.tokens_per_second.end());
      const char* kind = r.test.kind == Kind::prefill ? "prefill" : r.test.kind == Kind::decode ? "decode" : "workload";
      nlohmann::json row = {{"test", r.test.name},
                            {"kind", kind},
                            {"batch", r.test.batch},
                            {"prompt", r.test.prompt},
                            {"new_tokens", r.test.generated},
                            {"tokens", r.tokens},
                            {"seconds", r.seconds},
                            {"tokens_per_second", r.tokens_per_second},
                            {"tokens_per_second_min", *lo},
                            {"tokens_per_second_median", median(r.tokens_per_second)},
                            {"tokens_per_second_max", *hi}};
      if (r.test.kind == Kind::workload) {
        std::vector<double> total;
        for (double s : r.seconds) total.push_back(s > 0 ? r.total_tokens / s : 0);
        row["total_tokens_per_second_median"] = median(total);
      }
      for (const KernelChoice& k : r.kernels) {
        row["kernels"].push_back({{"op", k.op}, {"shapes", k.shapes}, {"kernel", k.choice}, {"calls", k.calls}});
      }
      report["rows"].push_back(std::move(row));
    }
    report["skipped"] = nlohmann::json::array();
    for (const auto& [t, reason] : skipped) {
      report["skipped"].push_back({{"test", t.name}, {"batch", t.batch}, {"reason", reason}});
    }
    std::ofstream file(o.json);
    file << report.dump(2) << "\n";
    MICROLLM_CHECK(file.good(), IoError, "bench", "cannot write ", o.json);
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench", "Prefill and decode speed, a llama-bench-style table");
  auto o = std::make_shared<BenchCliOptions>();
  CLI::Option* model = cmd->add_option("--model", o->model, "Model directory (config.json + safetensors)")
                           ->check(CLI::ExistingDirectory);
  CLI::Option* preset = cmd->add_option("--preset", o->preset, "A preset with random weights: tiny, model-s, model-m");
  CLI::Option* config =
      cmd->add_option("--config", o->config, "A Hugging Face config.json (or its directory), random weights")
          ->check(CLI::ExistingPath);
  model->excludes(preset)->excludes(config);
  preset->excludes(config);
  cmd->add_option("--vocab", o->vocab, "Vocabulary size of a --preset model")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random weights and token ids")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Weights and compute dtype: f32 or bf16")->capture_default_str();
  CLI::Option* prompts = cmd->add_option("-p,--n-prompt", o->prompts, "Prefill tests: prompt lengths (0: none)")
                             ->delimiter(',')
                             ->capture_default_str();
  CLI::Option* prefill_batches =
      cmd->add_option("--prefill-batch", o->prefill_batches, "Batch sizes of the prefill tests")
          ->delimiter(',')
          ->capture_default_str();
  CLI::Option* new_tokens = cmd->add_option("-n,--n-gen", o->new_tokens, "Decode tests: tokens per sequence (0: none)")
                                ->delimiter(',')
                                ->capture_default_str();
  CLI::Option* batches = cmd->add_option("-b,--batch", o->batches, "Batch sizes of the decode tests")
                             ->delimiter(',')
                             ->capture_default_str();
  CLI::Option* workloads =
      cmd->add_option("--workload", o->workloads, "End-to-end workloads PROMPT:BATCH:NEW_TOKENS (none: off)")
          ->delimiter(',')
          ->capture_default_str();
  cmd->add_option("-r,--repetitions", o->reps, "Timed repetitions per test")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed repetitions before them")->capture_default_str();
  cmd->add_option("--json", o->json, "Also write the results as JSON to this file");
  add_trace_option(cmd, o->trace);
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)");
  cmd->add_option("--path", o->path,
                  "engine: the serving engine (paged KV cache, CUDA graphs); plain: forward + KvCache")
      ->check(CLI::IsMember({"engine", "plain"}))
      ->capture_default_str();
  cmd->add_flag("--op-times", o->op_times,
                "CUDA: time every op with events (the engine without CUDA graphs) and print the slowest per test");
  cmd->add_flag("--explain", o->explain,
                "Print which kernel each fused or dispatching op chose in each test, with its launch shape");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Engine: prompt tokens per prefill forward")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([o, prompts, prefill_batches, new_tokens, batches, workloads] {
    o->prompts_given = prompts->count() > 0;
    o->prefill_batches_given = prefill_batches->count() > 0;
    o->new_tokens_given = new_tokens->count() > 0;
    o->batches_given = batches->count() > 0;
    o->workloads_given = workloads->count() > 0;
    run_bench(*o);
  });
}

}  // namespace microllm::app
