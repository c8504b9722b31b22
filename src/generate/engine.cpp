#include "microllm/generate/engine.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "generate/scheduler.h"
#include "microllm/autograd/variable.h"
#include "microllm/core/cuda.h"
#include "microllm/generate/kv_cache.h"
#include "microllm/generate/runner.h"
#include "microllm/ops/paged_attention.h"
#include "microllm/ops/sampling.h"
#include "microllm/profile/trace.h"

namespace microllm::generate {
namespace {

// Graphs of full chunks kept at most (one per chunk start: 64 cover a 32K window in chunks of 512); later starts
// run eagerly, so a tiny chunk size cannot make a long prompt capture a graph per token.
constexpr size_t kMaxChunkGraphs = 64;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows of a decode step's inputs (i32 [kStepRows, max_batch]). The step's last kernel moves them on by one
// token (paged_decode_advance), so they are uploaded (in one copy) only when the next step wants something
// else: a row starts or stops decoding. The ids a step feeds are on the device already (the step before
// sampled them there), but for a row's first step after a one-token prompt, which uploads that token on its
// own.
enum StepRow : int64_t { kRopePositions, kAttentionPositions, kSlots, kStepRows };

// A request in the engine: the scheduler's state (row, blocks, progress) and what the device work needs.
struct Sequence : SequenceState {
  EngineRequest request;
  bool first_step = false;  // the next decode step is its first and feeds the prompt's token from the host (a
                            // one-token prompt; a longer one's prefill samples its first token on the device)
  Generation result;
};

Sequence& sequence(SequenceState* s) { return *static_cast<Sequence*>(s); }

// A decode step enqueued and not yet read back: the rows it fed, and which host buffers it used. The last
// chunk of a prefill is one too: it samples its sequence's first token (buffer kPrefillBuffer).
struct StepInFlight {
  std::vector<std::pair<int64_t, uint64_t>> fed;  // (row, sequence id)
  int buffer = 0;
};
constexpr int kPrefillBuffer = 2;  // host_tokens[2]: a prefill's first token (steps use 0 and 1 in turn)

}  // namespace

struct Engine::Impl {
  const nn::TransformerLM& model;
  const nn::TransformerConfig& config;
  EngineOptions options;
  Device device;
  int64_t max_blocks_per_sequence = 0;  // the window in blocks
  Runner runner;                        // the model's weights as inference multiplies them
  std::unique_ptr<PagedKvCache> cache;

  // Device state, allocated once (graphs replay these addresses).
  Tensor block_tables;  // i32 [max_batch, max_blocks_per_sequence]
  Tensor step_inputs;   // i32 [kStepRows, max_batch]: what the next decode step reads
  Tensor row_ids;       // i32 [max_batch]: 0, 1, 2, ... (decode row r reads block table row r)
  SamplerRows sampler;  // params f32 [max_batch, 8], rng i64 [max_batch, 2], counts i32 and bias f32 [max_batch, vocab]
  int64_t sampler_columns = 0;
  Tensor greedy_params;  // f32 [8] on the device: what a row's params hold while no sequence decodes in it
  Tensor tokens;         // i32 [max_batch]: the ids each decode step feeds, and where it samples the next ones

  // Where each step's sampled ids land on the host: host_tokens[0] and [1] i32 [max_batch], written by decode
  // steps in turn (the steps in flight are at most two: see step()) through `outbox`, their device view, and
  // host_tokens[kPrefillBuffer] for a prefill's first token (copied; read in the step that sampled it); pinned
  // and mapped memory on CUDA (the step's last kernel writes it), host_storage on the CPU (where a step is done
  // when enqueued).
  std::optional<cuda::PinnedBuffer> pinned;
  std::vector<int32_t> host_storage;
  int32_t* host_tokens[3] = {nullptr, nullptr, nullptr};
  Tensor outbox;        // i32 [2, max_batch]: host_tokens[0] and [1] as the device writes them
  Tensor step_counter;  // i32 [1] on the device: decode steps run; step n writes outbox row n % 2
  // Host side (CPU tensors): a decode step's inputs as built, i32 [kStepRows, max_batch]; what step_inputs will
  // hold once the steps enqueued have run (each moves its inputs on: the same op, run here); block_tables as
  // uploaded, i32 [max_batch, max_blocks_per_sequence].
  Tensor step_host, predicted_inputs, host_tables;
  // CUDA: every upload (a step's inputs, a prefill chunk's ids, a new row's block table and sampler state)
  // goes through pinned memory without waiting, so the device's queue never drains for one.
  std::optional<cuda::UploadStaging> staging;
  std::vector<std::unique_ptr<cuda::Event>> tokens_read;  // CUDA: host_tokens[i] holds its step's ids
  std::deque<StepInFlight> in_flight;                     // oldest first
  // The outbox row of the next decode step (step_counter % 2, as the host counts).
  int next_buffer = 0;

  std::optional<cuda::Stream> stream;  // CUDA: the engine's work, eager and replayed
  uint64_t graph_pool = 0;
  // (rows, context bound, every row greedy) -> decode step. The all-greedy graphs sample with
  // SamplerRows::greedy_only (two kernels instead of about fourteen); a step with a sampled row replays the
  // general one.
  std::map<std::tuple<int64_t, int64_t, bool>, cuda::Graph> graphs;
  // Prefill chunks replayed from graphs. A replay reads the chunk's ids, slots and positions from
  // prefill_inputs and its sequence's blocks from prefill_table, both rewritten before it; everything else a
  // chunk's kernels take from the host (the chunk start and length, the shapes) is in the key.
  //   prefill_graphs: full chunks before a prompt's last (prefill_chunk tokens, KV cache only), by chunk start;
  //   prompt_graphs: whole prompts that fit one chunk together, a row each, padded to (rows, bucket) (ids 0,
  //     slots -1: not written; a row's padding comes after its prompt, so causal attention keeps it out of the
  //     prompt's rows), by (rows, bucket); it reads its own inputs and writes the logits of each row's last
  //     token into its `logits`.
  struct PromptGraph {
    cuda::Graph graph;
    Tensor inputs;     // i32 [3, rows * bucket]: ids, slots, rotary positions
    Tensor last_rows;  // i32 [rows]: each row's last prompt token, as a flat index into rows * bucket
    Tensor logits;     // [rows, 1, V]: allocated in the capture, from the graph pool
  };
  std::map<int64_t, cuda::Graph> prefill_graphs;
  std::map<std::pair<int64_t, int64_t>, PromptGraph> prompt_graphs;
  Tensor prefill_inputs;  // i32 [3, prefill_chunk]: a full chunk's ids, slots, rotary positions
  Tensor prefill_table;   // i32 [1, max_blocks_per_sequence]

  // Which requests run, where and how far (host only; thread-safe for submit, cancel and its counts).
  std::unique_ptr<Scheduler> scheduler;
  // The engine's own counters, shared with stats() under `mutex`.
  mutable std::mutex mutex;
  EngineStats counters;

  Impl(const nn::TransformerLM& m, EngineOptions o) : model(m), config(m.config()), options(o), runner(m, o.dtype) {
    MICROLLM_CHECK(options.max_batch >= 1, ValueError, "engine", "max_batch must be >= 1, got ", options.max_batch);
    MICROLLM_CHECK(options.block_size >= 1, ValueError, "engine", "block_size must be >= 1, got ", options.block_size);
    MICROLLM_CHECK(options.kv_memory_fraction > 0 && options.kv_memory_fraction <= 1, ValueError, "engine",
                   "kv_memory_fraction must be in (0, 1], got ", options.kv_memory_fraction);
    device = model.named_parameters().front().variable->device();
    max_blocks_per_sequence = ceil_div(config.context_limit(), options.block_size);
    const int64_t blocks = choose_block_count();
    if (device.is_cuda()) {
      cuda::synchronize(device.index);  // the weights were written on the default stream
      stream = cuda::Stream::create(device.index);
    }
    auto on_engine_stream = scoped_stream();
    cache = std::make_unique<PagedKvCache>(config, blocks, options.block_size, options.dtype, device);
    const int64_t b = options.max_batch;
    block_tables = Tensor::zeros({b, max_blocks_per_sequence}, DType::i32, device);
    step_inputs = Tensor::zeros({kStepRows, b}, DType::i32, device);
    const auto host_ints = static_cast<size_t>(3 * b);
    int32_t* host = nullptr;
    if (stream) {
      pinned.emplace(host_ints * sizeof(int32_t));
      host = static_cast<int32_t*>(pinned->data());
      outbox = Tensor::from_blob(pinned->device_data(), {2, b}, DType::i32, device);
      for (int i = 0; i < 3; ++i) tokens_read.push_back(std::make_unique<cuda::Event>(device.index));
      staging.emplace(*stream);
    } else {
      host_storage.assign(host_ints, 0);
      host = host_storage.data();
      outbox = Tensor::from_blob(host, {2, b}, DType::i32, device);
    }
    for (int i = 0; i < 3; ++i) host_tokens[i] = host + i * b;
    step_counter = Tensor::zeros({1}, DType::i32, device);
    step_host = Tensor::zeros({kStepRows, b}, DType::i32);
    predicted_inputs = Tensor::zeros({kStepRows, b}, DType::i32);  // step_inputs' zeros
    host_tables = Tensor::zeros({b, max_blocks_per_sequence}, DType::i32);
    row_ids = Tensor::arange(0, static_cast<double>(b), 1, DType::i32, device);
    sampler_columns = static_cast<int64_t>(SamplingParams().row().size());
    // Rows where no sequence decodes sample greedily (their ids are ignored), so that a step whose decoding
    // rows are all greedy may promise greedy_only for the whole [0, rows) range it samples.
    SamplingParams greedy;
    greedy.temperature = 0;
    greedy_params = Tensor::from_vector(greedy.row(), {sampler_columns}, device);
    sampler.params = greedy_params.reshape({1, sampler_columns}).expand({b, sampler_columns}).clone();
    sampler.rng = Tensor::zeros({b, 2}, DType::i64, device);
    sampler.counts = Tensor::zeros({b, config.vocab_size}, DType::i32, device);
    sampler.bias = Tensor::zeros({b, config.vocab_size}, DType::f32, device);  // read for rows with a logit bias
    tokens = Tensor::zeros({b}, DType::i32, device);
    if (stream && options.cuda_graphs) {
      prefill_inputs = Tensor::zeros({3, options.prefill_chunk}, DType::i32, device);
      prefill_table = Tensor::zeros({1, max_blocks_per_sequence}, DType::i32, device);
    }
    scheduler = std::make_unique<Scheduler>(
        SchedulerLimits{options.max_batch, options.block_size, blocks, config.context_limit(), options.prefill_chunk});
    counters.kv_blocks_total = blocks;
    counters.block_size = options.block_size;
    if (device.is_cuda()) {
      graph_pool = cuda::create_graph_pool();
      cuda::synchronize(device.index);
    }
  }

  ~Impl() {
    if (!device.is_cuda()) return;
    try {
      cuda::synchronize(device.index);
      graphs.clear();
      prefill_graphs.clear();
      prompt_graphs.clear();  // their logits go back to the pool too
      cuda::release_graph_pool(device.index, graph_pool);
    } catch (...) {  // a destructor must not throw; the memory stays cached
    }
  }

  int64_t choose_block_count() const {
    const size_t per_block = PagedKvCache::block_bytes(config, options.block_size, options.dtype);
    const int64_t most = options.max_batch * max_blocks_per_sequence;  // every row a full window
    if (options.kv_blocks > 0) return options.kv_blocks;
    if (!device.is_cuda()) {  // host pages are committed when first written, but stay modest anyway
      constexpr double kHostBudget = 1024.0 * 1024 * 1024;
      return std::clamp<int64_t>(static_cast<int64_t>(kHostBudget / static_cast<double>(per_block)), 1, most);
    }
    const double budget = options.kv_memory_fraction * static_cast<double>(cuda::memory_info(device.index).free);
    const auto fit = static_cast<int64_t>(budget / static_cast<double>(per_block));
    MICROLLM_CHECK(fit >= 1, OutOfMemoryError, "engine", "no room for one KV block of ", per_block, " bytes in ",
                   options.kv_memory_fraction, " of the free memory of ", device.str());
    return std::min(fit, most);
  }

  int trace_device() const { return device.is_cuda() ? device.index : -1; }

  std::optional<cuda::StreamGuard> scoped_stream() const {
    if (!stream) return std::nullopt;
    return std::optional<cuda::StreamGuard>(std::in_place, *stream);
  }

  // What the scheduler cannot know: the prompt's ids and the sampling parameters.
  void check_request(const EngineRequest& r) const {
    for (int32_t id : r.prompt) {
      MICROLLM_CHECK(id >= 0 && id < config.vocab_size, ValueError, "engine", "prompt id ", id,
                     " is outside the vocabulary of ", config.vocab_size);
    }
    r.sampling.check();
  }

  // ---- admission and finishing (engine thread) ----

  void admit() {
    for (SequenceState* admitted : scheduler->admit()) {
      Sequence& seq = sequence(admitted);
      upload_row_state(seq);
      if (seq.decoding) start_decoding(seq);  // a one-token prompt: nothing to prefill
      std::lock_guard<std::mutex> lock(mutex);
      counters.prompt_tokens += seq.request.prompt.size();
    }
  }

  // The sequence's block table row, written once at admission.
  void upload_row_state(const Sequence& seq) {
    int32_t* table = host_tables.select(0, seq.row).data<int32_t>();
    std::fill_n(table, max_blocks_per_sequence, 0);
    std::copy(seq.blocks.begin(), seq.blocks.end(), table);
    upload(block_tables.select(0, seq.row), table, max_blocks_per_sequence);
  }

  // The row samples from now on: the first token (from the prefill's last logits, or from the first decode
  // step for a one-token prompt), then every decode step. Its sampling parameters, random counter and token
  // counts start now, not at admission, because every decode step draws for every row of its batch, the rows
  // still prefilling included (their draws are ignored): until now the row was greedy (see greedy_params), so
  // that it does not keep the other rows off the greedy-only path.
  void start_decoding(Sequence& seq) {
    const SamplingParams& p = seq.request.sampling;
    const std::vector<std::vector<int32_t>> history =
        p.penalized() ? std::vector<std::vector<int32_t>>{seq.request.prompt} : std::vector<std::vector<int32_t>>{};
    // Built on the host, uploaded without a wait.
    const SamplerRows fresh = make_sampler_rows(p.row(), {static_cast<int64_t>(p.seed)}, config.vocab_size, history,
                                                Device::cpu(), {p.bias_row()});
    upload(sampler.params.select(0, seq.row), fresh.params.data<float>(), sampler_columns);
    upload(sampler.rng.narrow(0, seq.row, 1), fresh.rng.data<int64_t>(), 2);
    if (fresh.counts.defined()) {
      upload(sampler.counts.narrow(0, seq.row, 1), fresh.counts.data<int32_t>(), config.vocab_size);
    } else {
      sampler.counts.narrow(0, seq.row, 1).copy_(Tensor::zeros({1, config.vocab_size}, DType::i32, device));
    }
    if (fresh.bias.defined()) upload(sampler.bias.narrow(0, seq.row, 1), fresh.bias.data<float>(), config.vocab_size);
    seq.first_step = seq.request.prompt.size() == 1;
  }

  // Ends a sequence: its row and blocks go back, then its callback runs.
  void finish(Sequence* seq, FinishReason reason) {
    seq->result.finish_reason = reason;
    if (seq->decoding) sampler.params.select(0, seq->row).copy_(greedy_params);  // see start_decoding
    std::unique_ptr<SequenceState> owned = scheduler->finish(seq);
    if (seq->request.on_finish) seq->request.on_finish(seq->result);
  }

  // Records a sampled token; returns false when the sequence ended.
  bool accept(Sequence* seq, int32_t token) {
    seq->result.tokens.push_back(token);
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++counters.generated_tokens;
    }
    const bool go_on = !seq->request.on_token || seq->request.on_token(token);
    std::optional<FinishReason> reason = scheduler->accept(*seq, token);
    if (!go_on) reason = FinishReason::callback;
    if (reason) finish(seq, *reason);
    return !reason;
  }

  void apply_cancellations() {
    Scheduler::Cancelled cancelled = scheduler->take_cancelled();
    for (auto& s : cancelled.never_started) {
      Sequence& seq = sequence(s.get());
      seq.result.finish_reason = FinishReason::callback;
      if (seq.request.on_finish) seq.request.on_finish(seq.result);
    }
    for (SequenceState* s : cancelled.running) finish(&sequence(s), FinishReason::callback);
  }

  // ---- the model (engine thread, on the engine's stream) ----

  // One prefill forward (Scheduler::next_prefill): whole prompts together, or one chunk of a longer one. A
  // prompt's last forward also samples its first new token from the prompt's last logits, into the row's entry of
  // `tokens` where its first decode step finds it, and downloads it as a step in flight (read within this engine
  // step, see step()): a prompt's tokens all go through the prefill's large GEMMs and flash attention, and none
  // through a decode step's weight pass. A one-token prompt needs no prefill: its first decode step feeds it.
  bool prefill_step() {
    const std::optional<PrefillPlan> plan = scheduler->next_prefill();
    if (!plan) return false;
    profile::Scope span("engine.prefill", "engine");
    profile::GpuScope gpu_span("engine.prefill", "engine", trace_device());
    span.arg("sequences", static_cast<double>(plan->sequences.size()));
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++counters.prefill_forwards;
    }
    std::vector<Sequence*> group;
    for (SequenceState* s : plan->sequences) group.push_back(&sequence(s));
    const Tensor logits = plan->whole_prompts ? run_prompts(*plan, group) : run_chunk(*plan, *group.front());
    if (plan->last) sample_first_tokens(group, logits);
    scheduler->prefilled(*plan);
    return true;
  }

  // Each sequence of `group` starts decoding with its first token sampled from its row of `logits`
  // ([rows >= group.size(), 1, V], the prompts' last logits in group order), downloaded as one step in flight.
  void sample_first_tokens(const std::vector<Sequence*>& group, const Tensor& logits) {
    StepInFlight step{{}, kPrefillBuffer};
    for (size_t i = 0; i < group.size(); ++i) {
      Sequence& seq = *group[i];
      start_decoding(seq);
      const Tensor chosen = tokens.narrow(0, seq.row, 1);
      sample_tokens(logits.narrow(0, static_cast<int64_t>(i), 1).select(1, 0),
                    narrow_rows(seq.row, 1, seq.request.sampling.temperature == 0), chosen);
      download(host_tokens[kPrefillBuffer] + seq.row, chosen, 1);
      step.fed.emplace_back(seq.row, seq.id);
    }
    if (stream) tokens_read[kPrefillBuffer]->record(*stream);
    in_flight.push_back(std::move(step));
    std::lock_guard<std::mutex> lock(mutex);
    counters.prefill_samples += group.size();
  }

  // The whole prompts of `group` in one forward, a row each: replayed from the graph of their padded (rows,
  // length) on CUDA, eagerly (rows padded to the longest prompt) otherwise. Returns their last logits
  // [rows, 1, V], group order.
  Tensor run_prompts(const PrefillPlan& plan, const std::vector<Sequence*>& group) {
    std::vector<ChunkSpan> spans;
    for (const Sequence* s : group) spans.push_back({s, 0, s->prompt_tokens});
    if (stream && options.cuda_graphs) {
      const PromptGraph& g = prompt_graph(plan.rows, plan.length);
      upload_chunks(g.inputs, g.last_rows, spans);
      g.graph.replay();
      count_prefill_replay();
      return g.logits;
    }
    const auto prompt_rows = static_cast<int64_t>(group.size());
    const Tensor inputs = Tensor::empty({3, prompt_rows * plan.count}, DType::i32, device);
    const Tensor last_rows = Tensor::empty({prompt_rows}, DType::i32, device);
    upload_chunks(inputs, last_rows, spans);
    PagedPrefill attention = prefill_attention(inputs, block_tables, 0, 0, prompt_rows);
    return runner.forward(prefill_ids(inputs, prompt_rows), attention, LogitRows::chosen(last_rows));
  }

  // One chunk of `seq`'s prompt, [start, start + count), not all of it in one (see prefill_step): replayed from
  // the graph of its start when it is a full chunk before the last, eagerly otherwise. Returns the prompt's last
  // logits [1, 1, V] for the last chunk, nothing for an earlier one.
  Tensor run_chunk(const PrefillPlan& plan, const Sequence& seq) {
    const int64_t start = plan.start, count = plan.count;
    const bool replay = stream && options.cuda_graphs;
    if (replay && !plan.last && (prefill_graphs.count(start) || prefill_graphs.size() < kMaxChunkGraphs)) {
      // count == prefill_chunk: only the last chunk is shorter
      upload_chunks(prefill_inputs, Tensor(), {{&seq, start, count}});
      prefill_table.copy_(block_tables.narrow(0, seq.row, 1));
      prefill_graph(start).replay();
      count_prefill_replay();
      return {};
    }
    const Tensor on_device = Tensor::empty({3, count}, DType::i32, device);
    upload_chunks(on_device, Tensor(), {{&seq, start, count}});
    PagedPrefill attention = prefill_attention(on_device, block_tables, start, seq.row, 1);
    const Tensor ids = prefill_ids(on_device, 1);
    if (plan.last) return runner.forward(ids, attention, LogitRows::last());
    runner.fill(ids, attention);  // nobody reads an earlier chunk's logits
    return {};
  }

  // Tokens [start, start + count) of a sequence's prompt: one row of a prefill forward.
  struct ChunkSpan {
    const Sequence* seq;
    int64_t start, count;
  };

  // Writes the ids, slots and rotary positions of `spans` to `inputs` (i32 [3, rows * width], rows >= spans),
  // row r holding spans[r] padded past its count with id 0, slot -1 (not written) and its last position; rows
  // past the spans are all padding. last_rows (i32 [rows], when defined; else one row) gets each row's last
  // token as a flat index.
  void upload_chunks(const Tensor& inputs, const Tensor& last_rows, const std::vector<ChunkSpan>& spans) {
    const auto prompt_rows = static_cast<int64_t>(last_rows.defined() ? last_rows.numel() : 1);
    const int64_t total = inputs.size(1), width = total / prompt_rows;
    std::vector<int32_t> host(static_cast<size_t>(3 * total), 0), last(static_cast<size_t>(prompt_rows), 0);
    int32_t* ids = host.data();
    int32_t* slots = ids + total;
    int32_t* positions = slots + total;
    std::fill_n(slots, total, -1);
    for (int64_t r = 0; r < static_cast<int64_t>(spans.size()); ++r) {
      const auto& [seq, start, count] = spans[static_cast<size_t>(r)];
      for (int64_t i = 0; i < width; ++i) {
        const int64_t position = start + std::min(i, count - 1);
        const auto at = static_cast<size_t>(r * width + i);
        positions[at] = static_cast<int32_t>(position);
        if (i >= count) continue;
        ids[at] = seq->request.prompt[static_cast<size_t>(position)];
        slots[at] = scheduler->slot_of(*seq, position);
      }
      last[static_cast<size_t>(r)] = static_cast<int32_t>(r * width + count - 1);
    }
    upload(inputs, host.data(), 3 * total);
    if (last_rows.defined()) upload(last_rows, last.data(), prompt_rows);
  }

  void count_prefill_replay() {
    std::lock_guard<std::mutex> lock(mutex);
    ++counters.prefill_graph_replays;
  }

  // A prefill forward's attention from its inputs (i32 [3, rows * width]: ids, slots, positions) and, for a
  // chunk past a prompt's start, its sequence's row of `tables`; and its ids [rows, width].
  PagedPrefill prefill_attention(const Tensor& inputs, const Tensor& tables, int64_t start, int64_t row,
                                 int64_t prompt_rows) const {
    const int64_t width = inputs.size(1) / prompt_rows;
    return PagedPrefill(*cache, {.slots = inputs.select(0, 1),
                                 .positions = inputs.select(0, 2).reshape({prompt_rows, width}),
                                 .block_tables = tables,
                                 .chunk_start = start,
                                 .chunk_row = row});
  }
  static Tensor prefill_ids(const Tensor& inputs, int64_t prompt_rows) {
    return inputs.select(0, 0).reshape({prompt_rows, inputs.size(1) / prompt_rows});
  }

  // The graph of a full prefill chunk (not a prompt's last) starting at `start`, captured on first use.
  const cuda::Graph& prefill_graph(int64_t start) {
    return cached(prefill_graphs, start, [&](cuda::Graph& graph) {
      graph = cuda::Graph::capture(*stream, graph_pool, [&] {
        PagedPrefill attention = prefill_attention(prefill_inputs, prefill_table, start, 0, 1);
        runner.fill(prefill_ids(prefill_inputs, 1), attention);
      });
    });
  }

  // The graph of `prompt_rows` whole prompts of at most `bucket` tokens each, captured on first use.
  const PromptGraph& prompt_graph(int64_t prompt_rows, int64_t bucket) {
    return cached(prompt_graphs, std::pair{prompt_rows, bucket}, [&](PromptGraph& g) {
      g.inputs = Tensor::zeros({3, prompt_rows * bucket}, DType::i32, device);
      g.last_rows = Tensor::zeros({prompt_rows}, DType::i32, device);
      g.graph = cuda::Graph::capture(*stream, graph_pool, [&] {
        PagedPrefill attention = prefill_attention(g.inputs, prefill_table, 0, 0, prompt_rows);
        g.logits = runner.forward(prefill_ids(g.inputs, prompt_rows), attention, LogitRows::chosen(g.last_rows));
      });
    });
  }

  SamplerRows narrow_rows(int64_t first, int64_t count, bool greedy_only) const {
    return SamplerRows{sampler.params.narrow(0, first, count), sampler.rng.narrow(0, first, count),
                       sampler.counts.narrow(0, first, count), sampler.bias.narrow(0, first, count), greedy_only};
  }

  // The decode forward + sampling over rows [0, rows) with attention bounded by `context`: what a graph
  // records. Reads tokens (the ids to feed), step_inputs, block_tables and the sampler state; writes the cache,
  // the sampler state and tokens[0, rows) (the ids sampled, which the next step feeds). greedy_only: every row
  // of [0, rows) that is fed a sequence's token has greedy params on the device.
  void decode_forward(int64_t batch_rows, int64_t context, bool greedy_only) {
    PagedDecode attention(*cache, {.slots = step_inputs.select(0, kSlots).narrow(0, 0, batch_rows),
                                   .block_tables = block_tables.narrow(0, 0, batch_rows),
                                   .seq_ids = row_ids.narrow(0, 0, batch_rows),
                                   .positions = step_inputs.select(0, kAttentionPositions).narrow(0, 0, batch_rows),
                                   .max_context = context});
    const Tensor ids = tokens.narrow(0, 0, batch_rows).reshape({batch_rows, 1});
    const Tensor logits = runner.forward(ids, attention);  // [rows, 1, V]
    const Tensor chosen = tokens.narrow(0, 0, batch_rows);
    sample_tokens(logits.select(1, 0), narrow_rows(0, batch_rows, greedy_only), chosen);
    // The next step's positions and slots, and the ids to the host: no copy either way.
    paged_decode_advance(step_inputs, block_tables, options.block_size, chosen, outbox, step_counter);
  }

  // The decode step's graph for (rows, context bound, greedy_only), captured on first use.
  const cuda::Graph& decode_graph(int64_t batch_rows, int64_t context, bool greedy_only) {
    return cached(graphs, std::tuple{batch_rows, context, greedy_only}, [&](cuda::Graph& graph) {
      graph = cuda::Graph::capture(*stream, graph_pool, [&] { decode_forward(batch_rows, context, greedy_only); });
    });
  }

  // The entry of `entries` under `key`, filled by `capture` on first use (a capture that throws leaves none).
  template <typename Map, typename Capture>
  const typename Map::mapped_type& cached(Map& entries, const typename Map::key_type& key, Capture&& capture) {
    auto [it, fresh] = entries.try_emplace(key);
    if (fresh) {
      try {
        capture(it->second);
      } catch (...) {
        entries.erase(it);
        throw;
      }
      std::lock_guard<std::mutex> lock(mutex);
      ++counters.graphs_captured;
    }
    return it->second;
  }

  // Copies between the host and the device: enqueued on the engine's stream on CUDA (the host does not wait;
  // an upload's source may change once it returns, a download's destination is pinned), done at once on the
  // CPU. `dst` of an upload: `count` contiguous elements of type T.
  template <typename T>
  void upload(const Tensor& dst, const T* src, int64_t count) {
    MICROLLM_CHECK(dst.is_contiguous() && dst.numel() == count && dtype_size(dst.dtype()) == sizeof(T), BackendError,
                   "engine", "an upload of ", count, " elements of ", sizeof(T), " bytes into ", dst.shape(), " ",
                   dst.dtype());
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    if (staging)
      staging->upload(dst.data_ptr(), src, bytes);
    else
      std::memcpy(dst.data_ptr(), src, bytes);
  }
  void download(int32_t* dst, const Tensor& src, int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(int32_t);
    if (stream)
      cuda::copy_async(dst, src.data_ptr(), bytes, cuda::CopyDirection::device_to_host, *stream);
    else
      std::memcpy(dst, src.data_ptr(), bytes);
  }

  // Enqueues one decode step (Scheduler::next_decode): an upload of the step's positions and slots unless the
  // step before left the same on the device (and of the first token of a sequence's first step), one graph
  // replay, which ends by writing the sampled ids to host_tokens. The ids are read later (read_oldest_step):
  // meanwhile the host prepares the next step. A stop id or a cancellation shows only when its step is read, so
  // such a sequence is fed once more; that row's token is discarded (EngineStats::discarded_rows) and its k/v
  // land in a slot it still owns.
  bool enqueue_decode_step() {
    const std::optional<DecodePlan> plan = scheduler->next_decode();
    if (!plan) return false;
    profile::Scope span("engine.decode", "engine");
    profile::GpuScope gpu_span("engine.decode", "engine", trace_device());
    span.arg("rows", static_cast<double>(plan->fed.size()));
    const int64_t batch_rows = plan->rows, context = plan->context;
    const bool all_greedy = plan->greedy_only;

    // The step's inputs: rows not fed feed whatever id their tokens entry holds at rope position 0, attend to
    // nothing (-1) and write nowhere (-1); their samples are ignored.
    const int buffer = next_buffer;
    next_buffer ^= 1;
    const auto b = static_cast<size_t>(options.max_batch);
    int32_t* host = step_host.data<int32_t>();
    std::fill_n(host + kRopePositions * b, b, 0);
    std::fill_n(host + kAttentionPositions * b, b, -1);
    std::fill_n(host + kSlots * b, b, -1);
    StepInFlight step{{}, buffer};
    for (SequenceState* s : plan->fed) {
      const auto r = static_cast<size_t>(s->row);
      host[kRopePositions * b + r] = host[kAttentionPositions * b + r] = static_cast<int32_t>(s->cached);
      host[kSlots * b + r] = scheduler->slot_of(*s, s->cached);
      step.fed.emplace_back(s->row, s->id);
    }
    const bool changed = !std::equal(host, host + kStepRows * b, predicted_inputs.data<int32_t>());
    if (changed) upload(step_inputs, host, kStepRows * options.max_batch);
    predicted_inputs.copy_(step_host);
    paged_decode_advance(predicted_inputs, host_tables, options.block_size);  // what the step leaves
    for (SequenceState* state : plan->fed) {
      Sequence& s = sequence(state);
      if (!s.first_step) continue;
      upload(tokens.narrow(0, s.row, 1), &s.request.prompt.back(), 1);
      s.first_step = false;
    }
    if (stream && options.cuda_graphs) {
      decode_graph(batch_rows, context, all_greedy).replay();
      std::lock_guard<std::mutex> lock(mutex);
      ++counters.graph_replays;
    } else {
      decode_forward(batch_rows, context, all_greedy);
    }
    if (stream) tokens_read[static_cast<size_t>(buffer)]->record(*stream);
    scheduler->decoded(*plan);
    in_flight.push_back(std::move(step));
    std::lock_guard<std::mutex> lock(mutex);
    ++counters.decode_steps;
    if (all_greedy) ++counters.greedy_decode_steps;
    if (changed) ++counters.input_uploads;
    return true;
  }

  // Waits for the oldest step in flight and hands each fed row's token to its sequence, unless the sequence
  // ended (or its row went to another) since the step was enqueued.
  void read_oldest_step() {
    const StepInFlight step = std::move(in_flight.front());
    in_flight.pop_front();
    if (stream) tokens_read[static_cast<size_t>(step.buffer)]->synchronize();
    const int32_t* chosen = host_tokens[step.buffer];
    uint64_t accepted = 0, discarded = 0;  // counted for decode steps only
    for (const auto& [row, id] : step.fed) {
      SequenceState* s = scheduler->in_row(row);
      if (!s || s->id != id) {
        ++discarded;
        continue;
      }
      ++accepted;
      accept(&sequence(s), chosen[row]);
    }
    if (step.buffer == kPrefillBuffer) return;
    std::lock_guard<std::mutex> lock(mutex);
    counters.decoded_sequences += accepted;
    counters.discarded_rows += discarded;
  }
};

Engine::Engine(const nn::TransformerLM& model, EngineOptions options) : impl_(std::make_unique<Impl>(model, options)) {}

Engine::~Engine() = default;

uint64_t Engine::submit(EngineRequest request) {
  impl_->check_request(request);
  auto seq = std::make_unique<Sequence>();
  seq->prompt_tokens = static_cast<int64_t>(request.prompt.size());
  seq->max_new_tokens = request.max_new_tokens;
  seq->greedy = request.sampling.temperature == 0;
  seq->stop_ids = request.stop_ids;
  seq->request = std::move(request);
  return impl_->scheduler->submit(std::move(seq));
}

void Engine::cancel(uint64_t id) { impl_->scheduler->cancel(id); }

bool Engine::step() {
  autograd::NoGradGuard no_grad;
  auto on_engine_stream = impl_->scoped_stream();
  profile::Scope span("engine.step", "engine");
  MemoryCategoryScope memory(MemoryCategory::activations);
  {
    profile::Scope schedule("engine.schedule", "engine");
    impl_->apply_cancellations();
    impl_->admit();
  }
  const bool prefilled = impl_->prefill_step();
  // Step t + 1 is enqueued before step t's tokens are read, so the device runs it while the host hands out
  // step t's tokens and prepares step t + 2 (nothing waits for the host between steps); the last step is read
  // when there is nothing left to enqueue, or nothing left running (a step in flight then fed only rows of
  // ended sequences: reading it now leaves an idle engine with nothing in flight).
  const bool decoded = impl_->enqueue_decode_step();
  auto& in_flight = impl_->in_flight;
  const size_t keep = decoded ? 1 : 0;
  const bool read = in_flight.size() > keep;
  {
    profile::Scope read_span("engine.read", "engine");
    while (in_flight.size() > keep) impl_->read_oldest_step();
    if (impl_->scheduler->running().empty()) {
      while (!in_flight.empty()) impl_->read_oldest_step();
    }
  }
  if (profile::tracing()) {
    const SchedulerCounts counts = impl_->scheduler->counts();
    profile::counter("engine.kv_blocks_used", static_cast<double>(counts.blocks_used));
    profile::counter("engine.decoding", static_cast<double>(counts.decoding));
    profile::counter("engine.waiting", static_cast<double>(counts.waiting));
  }
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (prefilled || decoded || read) ++impl_->counters.steps;
  return prefilled || decoded || read;
}

void Engine::run_until_idle() {
  while (!idle()) step();
}

bool Engine::idle() const { return impl_->scheduler->idle(); }

EngineStats Engine::stats() const {
  const SchedulerCounts counts = impl_->scheduler->counts();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  EngineStats s = impl_->counters;
  s.waiting = counts.waiting;
  s.prefilling = counts.prefilling;
  s.decoding = counts.decoding;
  s.kv_blocks_used = counts.blocks_used;
  return s;
}

const EngineOptions& Engine::options() const { return impl_->options; }

int64_t Engine::max_request_tokens() const {
  return std::min(impl_->cache->num_blocks() * impl_->options.block_size, impl_->config.context_limit());
}

}  // namespace microllm::generate
