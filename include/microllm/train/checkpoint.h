// Checkpoint directories, written atomically.
//
// A training checkpoint is a directory:
//   model.safetensors      the weights under Hugging Face names (metadata {"format": "pt"}), f32
//   config.json            the Hugging Face config (transformers loads the directory as it is)
//   optimizer.safetensors  "<slot>.<parameter name>" per state tensor and "step" (train/optimizer.h)
//   trainer_state.json     step, generator states, data position, the train config, the schedule, metrics
//   tokenizer.json         when training used a Hugging Face tokenizer (absent: the byte tokenizer)
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "microllm/nn/transformer.h"

namespace microllm::train {

// Fills DIR.tmp-<pid> through fill(tmp_dir), syncs it, then swaps it in for `dir` (renameat2 with
// RENAME_EXCHANGE where the file system has it; else two renames) and removes the previous one. A crash
// at any point leaves the previous checkpoint or the new one complete, never a mix: `dir` is replaced only
// after every new file is written and synced.
void write_directory_atomically(const std::string& dir, const std::function<void(const std::string& tmp_dir)>& fill);

// The model part of a checkpoint (model.safetensors + config.json) is written and read by
// models::save_model / models::load_model (include/microllm/models/loader.h).

}  // namespace microllm::train
