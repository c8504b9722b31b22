// `microllm align`: where does a model stop matching transformers? The model runs on a reference dump's input ids
// with each of the dump's points tapped (microllm/nn/taps.h) and every point is compared with transformers' value
// there (tools/oracle/align_reference.py writes the dump):
//   microllm align --model DIR --reference dump.safetensors [--backward] [--svg depth.svg]
// prints a table per stage (max |diff|, relative error, cosine), marks the first point past the tolerance, and
// with --backward does the same for the gradients of the mean cross-entropy against the dump's targets.
// Exit status 0 when every point is within the tolerance, 2 when one is not (1 for errors).
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "microllm/autograd/variable.h"
#include "microllm/core/threads.h"
#include "microllm/io/atomic_file.h"
#include "microllm/io/safetensors.h"
#include "microllm/models/loader.h"
#include "microllm/nn/taps.h"
#include "microllm/profile/alignment.h"

namespace microllm::app {
namespace {

struct AlignCliOptions {
  std::string model, reference, device = "cpu", dtype, svg;
  bool backward = false;
  double tolerance = 0;
  int threads = 0;
};

constexpr const char* kGradientPrefix = "grad/";

// The relative error that rounding alone stays under: f32 agrees to ~1e-6 (different summation orders); bf16
// carries ~4e-3 per rounding, compounded over a few layers.
double default_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-4 : 5e-2; }

bool is_gradient(const std::string& name) { return name.rfind(kGradientPrefix, 0) == 0; }

void run_align(const AlignCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const io::SafetensorsFile dump = io::SafetensorsFile::open(o.reference);
  for (const char* required : {"input_ids", "targets"}) {
    MICROLLM_CHECK(dump.contains(required), ValueError, "align", o.reference, " has no '", required,
                   "' tensor: is it a dump of tools/oracle/align_reference.py?");
  }
  const auto meta = dump.metadata();
  const std::string dump_dtype = meta.count("dtype") ? meta.at("dtype") : "f32";
  const DType dtype = parse_dtype(o.dtype.empty() ? dump_dtype : o.dtype);
  MICROLLM_CHECK(dtype == DType::f32 || dtype == DType::bf16, ValueError, "align", "--dtype must be f32 or bf16, got ",
                 o.dtype);
  const double tolerance = o.tolerance > 0 ? o.tolerance : default_tolerance(dtype);

  std::vector<std::string> points;  // the dump's points: the taps to set
  bool has_gradients = false;
  for (const io::TensorInfo& info : dump.tensors()) {
    if (info.name == "input_ids" || info.name == "targets") continue;
    if (is_gradient(info.name)) {
      has_gradients = true;
    } else {
      points.push_back(info.name);
    }
  }
  MICROLLM_CHECK(!o.backward || has_gradients, ValueError, "align", "--backward: ", o.reference,
                 " holds no gradients (make it with align_reference.py --backward)");

  models::LoadOptions load;
  load.device = Device::parse(o.device);
  load.dtype = dtype;
  const models::LoadedModel loaded = models::load_model(o.model, load);
  const nn::TransformerLM& model = *loaded.model;
  const Tensor ids = dump.get("input_ids").to(DType::i64), targets = dump.get("targets").to(DType::i64);
  MICROLLM_CHECK(ids.dim() == 2 && targets.shape() == ids.shape(), ShapeError, "align", o.reference,
                 ": input_ids ", ids.shape(), " and targets ", targets.shape(), " must both be [B, T]");

  nn::Taps taps(points);
  taps.with_gradients(o.backward);
  nn::ForwardContext ctx;
  ctx.compute_dtype = dtype;
  ctx.taps = &taps;
  if (o.backward) {
    model.loss(ids.to(load.device), targets.to(load.device), ctx).backward();
  } else {
    autograd::NoGradGuard no_grad;
    model.forward(ids.to(load.device), ctx);
  }

  profile::Alignment alignment;
  alignment.tolerance = tolerance;
  std::set<std::string> produced;
  for (const nn::TapRecord& r : taps.values()) {
    produced.insert(r.name);
    alignment.values.push_back(profile::compare_point(r.name, r.tensor, dump.get(r.name), tolerance));
  }
  for (const std::string& name : points) {
    if (!produced.count(name)) alignment.values.push_back(profile::missing_point(name, dump.get(name)));
  }
  if (o.backward) {
    for (const nn::TapRecord& r : taps.gradients()) {
      const std::string name = kGradientPrefix + r.name;
      if (dump.contains(name)) {
        alignment.gradients.push_back(profile::compare_point(r.name, r.tensor, dump.get(name), tolerance));
      }
    }
  }

  std::cout << "model " << o.model << " (" << load.device.str() << ", " << dtype << ") against " << o.reference;
  if (meta.count("transformers")) std::cout << " (transformers " << meta.at("transformers") << ", " << dump_dtype << ")";
  std::cout << "\ninput " << ids.shape() << "\n\n" << profile::to_text(alignment);
  if (!o.svg.empty()) {
    io::write_text_atomically(o.svg, profile::to_svg(alignment, "relative error by depth: " + o.model));
    std::cout << "svg: " << o.svg << "\n";
  }
  if (alignment.first_divergent_value() || alignment.first_divergent_gradient()) throw CLI::RuntimeError(2);
}

}  // namespace

void register_align(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "align", "Compare a model's activations (and gradients) point by point with a transformers reference dump");
  auto o = std::make_shared<AlignCliOptions>();
  cmd->add_option("--model", o->model, "Model directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--reference", o->reference, "Dump of tools/oracle/align_reference.py (.safetensors)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "f32 or bf16 (default: the dump's)");
  cmd->add_flag("--backward", o->backward, "Also compare the gradients of the loss at each point");
  cmd->add_option("--tolerance", o->tolerance, "Largest relative error (default: 1e-4 in f32, 5e-2 in bf16)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--svg", o->svg, "Write the relative error by depth as an SVG");
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)");
  cmd->callback([o] { run_align(*o); });
}

}  // namespace microllm::app
