#include "microllm/nn/taps.h"

#include <utility>

namespace microllm::nn {

namespace {
constexpr std::string_view kAttentionWeights = "attn_weights";

// Glob matching where '*' stands for any run of characters.
bool matches(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p, ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

const Tensor* find(const std::vector<TapRecord>& records, std::string_view name) {
  for (const TapRecord& r : records) {
    if (r.name == name) return &r.tensor;
  }
  return nullptr;
}
}  // namespace

Taps::Taps(std::vector<std::string> patterns) : patterns_(std::move(patterns)) {}

Taps& Taps::with_gradients(bool on) {
  gradients_ = on;
  return *this;
}

Taps& Taps::on_value(Callback callback) {
  on_value_ = std::move(callback);
  return *this;
}

Taps& Taps::on_gradient(Callback callback) {
  on_gradient_ = std::move(callback);
  return *this;
}

bool Taps::wants(const std::string& name) const {
  const bool attention_weights = name.ends_with(kAttentionWeights);
  if (patterns_.empty()) return !attention_weights;
  for (const std::string& pattern : patterns_) {
    if (!matches(pattern, name)) continue;
    // Attention weights cost T^2 per head: only a pattern that names them or the attention module selects them.
    if (!attention_weights || pattern.find(kAttentionWeights) != std::string::npos ||
        pattern.find("self_attn") != std::string::npos) {
      return true;
    }
  }
  return false;
}

void Taps::record(const std::string& name, const Tensor& value) {
  if (!wants(name)) return;
  if (on_value_) {
    on_value_(name, value);
  } else {
    values_.push_back({name, value.clone()});
  }
}

autograd::Variable Taps::operator()(const std::string& name, const autograd::Variable& x) {
  if (!wants(name)) return x;
  record(name, x.value());
  if (!gradients_ || !autograd::grad_enabled() || !x.requires_grad()) return x;
  return autograd::record("tap", x.value(), {x}, [this, name](const std::vector<Tensor>& grad_outputs) {
    const Tensor& grad = grad_outputs[0];
    if (grad.defined()) {
      if (on_gradient_) {
        on_gradient_(name, grad);
      } else {
        gradients_recorded_.push_back({name, grad.clone()});
      }
    }
    return std::vector<Tensor>{grad};
  });
}

const Tensor* Taps::value(std::string_view name) const { return find(values_, name); }

const Tensor* Taps::gradient(std::string_view name) const { return find(gradients_recorded_, name); }

void Taps::clear() {
  values_.clear();
  gradients_recorded_.clear();
}

}  // namespace microllm::nn
