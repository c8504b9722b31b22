// `microllm prepare`: text files -> train and validation token files for `microllm train`.
//   microllm prepare --input data/corpora/kjv.txt --output data/tokens/kjv            # byte tokenizer
//   microllm prepare --input a.txt b.txt --output data/tokens/ab --tokenizer models/Qwen3-0.6B
#include <iostream>
#include <memory>

#include "commands.h"
#include "microllm/train/data.h"

namespace microllm::app {

void register_prepare(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("prepare", "Tokenize text files into train and validation token files");
  auto o = std::make_shared<train::PrepareOptions>();
  cmd->add_option("--input", o->inputs, "Text files (UTF-8), joined in order")->required()->check(CLI::ExistingFile);
  cmd->add_option("--output", o->output, "Output prefix: writes PREFIX.train.bin and PREFIX.val.bin")->required();
  cmd->add_option("--tokenizer", o->tokenizer_path,
                  "A Hugging Face tokenizer (tokenizer.json or a model directory); default: bytes (ids 0..255)");
  cmd->add_option("--val-fraction", o->val_fraction, "Fraction of the text held out for validation")
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--block-tokens", o->block_tokens, "Tokens per block when choosing the validation blocks");
  cmd->callback([o] {
    const train::PrepareResult r = train::prepare_token_files(*o);
    std::cout << "prepare: " << r.text_bytes << " bytes of text -> " << r.train_tokens + r.val_tokens << " tokens ("
              << r.tokenizer << ", vocab " << r.vocab_size << ")\n"
              << "  " << r.train_path << ": " << r.train_tokens << " tokens\n"
              << "  " << r.val_path << ": " << r.val_tokens << " tokens\n";
    if (!r.tokenizer_copy.empty()) std::cout << "  " << r.tokenizer_copy << ": the tokenizer, for training\n";
  });
}

}  // namespace microllm::app
