// The gated MLP's activation over one projection by [w_gate; w_up]: out = act(gate) * up, the two halves of the
// product. Each is defined by the elementwise ops it stands for, with their roundings to the compute dtype.
#pragma once

#include <cstdint>

namespace microllm {

enum class GatedActivation : uint8_t {
  none,    // no gate: the product itself
  swiglu,  // silu(gate) * up, rounded once: the swiglu op (Llama, Qwen, Mistral, Phi-3)
  geglu,   // gelu_tanh(gate) rounded, times up, rounded: the gelu and mul ops (Gemma's MLP)
};

inline const char* gated_activation_name(GatedActivation g) {
  switch (g) {
    case GatedActivation::none: return "none";
    case GatedActivation::swiglu: return "swiglu";
    case GatedActivation::geglu: return "geglu";
  }
  return "?";
}

}  // namespace microllm
