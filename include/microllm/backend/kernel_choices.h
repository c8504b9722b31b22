// Which kernel each fused or dispatching op chose, for `microllm bench --explain` and tests: off by default (one
// relaxed load a call); when on, each op records (op, shapes, choice) once per distinct triple, in first-seen order.
// A CUDA graph's replays run what its capture chose, so the capture's records stand for them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace microllm {

struct KernelChoice {
  std::string op;      // e.g. "paged_decode_attention_projected"
  std::string shapes;  // what the choice depended on, e.g. "tokens 1, heads 14/2 x 64, context 4096"
  std::string choice;  // the kernel and its launch shape, or "composition: ..."
  int64_t calls = 0;   // host calls that chose it (graph replays not counted)
};

void set_recording_kernel_choices(bool on);
bool recording_kernel_choices();
void record_kernel_choice(std::string_view op, std::string_view shapes, std::string_view choice);
std::vector<KernelChoice> kernel_choices();
void clear_kernel_choices();

}  // namespace microllm
