#!/usr/bin/env python3
"""Golden files for microLLM's tokenizer tests, from Hugging Face `tokenizers` and `transformers`.

Run where both libraries are installed; no network is used (the tokenizer files are paths):

    scripts/fetch-tokenizers.sh                      # on a machine with network: fills data/tokenizers/
    python3 tools/oracle/tokenizer_golden.py         # where tokenizers + transformers are installed

Inputs (relative to the repository root unless given):
  data/tokenizers/<name>/          tokenizer.json + tokenizer_config.json (qwen3, llama3, deepseek_v3),
                                   encoder.json + vocab.bpe (gpt2)
  tests/fixtures/tokenizer/texts.jsonl           one JSON string per line
  tests/fixtures/tokenizer/conversations.json    [{"name", "messages"}]
  tests/fixtures/tokenizer/templates/*.jinja     Qwen2.5-Instruct and DeepSeek-R1-Distill-Qwen templates

Outputs (tests/fixtures/tokenizer/):
  golden_<name>.jsonl   line 1: {"meta": {...}}; then one line per text:
      {"i", "ids": encode(add_special_tokens=False), "ids_special": encode(add_special_tokens=True),
       "decoded": decode(ids), "decoded_skip": decode(ids_special, skip_special_tokens=True),
       "hf_ids_special": transformers tokenizer(text).input_ids, "hf_decoded": transformers decode(ids),
       "hf_ids": transformers tokenizer(text, add_special_tokens=False).input_ids, only where it differs from ids}
    (ids/decoded: the `tokenizers` library on tokenizer.json; hf_*: transformers' AutoTokenizer on the
    directory, which also applies tokenizer_config.json)
  golden_chat.jsonl     one line per (template, conversation, add_generation_prompt, enable_thinking):
      {"template", "template_file", "tokenizer", "conversation", "add_generation_prompt",
       "enable_thinking", "bos_token", "eos_token", "text": apply_chat_template(tokenize=False),
       "ids": encode(text, add_special_tokens=False)}
"""
import argparse
import hashlib
import json
import os
import pathlib
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMES = ["qwen3", "llama3", "deepseek_v3", "gpt2"]

# (template name, template source: a fixture file or None for the tokenizer's own, tokenizer directory)
TEMPLATES = [
    ("qwen2.5", "templates/qwen2.5-instruct.jinja", "qwen3"),
    ("qwen3", None, "qwen3"),
    ("deepseek-r1-distill-qwen", "templates/deepseek-r1-distill-qwen.jinja", "deepseek_v3"),
    ("deepseek-v3", None, "deepseek_v3"),
    ("llama3", None, "llama3"),
]


def dump(obj):
    # One JSON value per line; U+2028/U+2029/U+0085 escaped so that no reader sees a line break in them.
    line = json.dumps(obj, ensure_ascii=False)
    for ch in ("\u2028", "\u2029", "\u0085"):
        line = line.replace(ch, "\\u%04x" % ord(ch))
    return line + "\n"


class RawAsTransformers:
    """transformers' calling convention over a `tokenizers.Tokenizer`, when transformers cannot load the files."""

    def __init__(self, raw, special):
        self.raw, self.bos_token, self.eos_token = raw, special, special
        self.bos_token_id = self.eos_token_id = raw.token_to_id(special)
        self.clean_up_tokenization_spaces = False

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.raw.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids):  # transformers keeps special tokens by default; `tokenizers` skips them
        return self.raw.decode(ids, skip_special_tokens=False)

    def __len__(self):
        return self.raw.get_vocab_size(with_added_tokens=True)


def gpt2_reference(d):
    """GPT-2 from encoder.json + vocab.bpe: the pipeline transformers' GPT2Converter builds, in `tokenizers`
    alone (transformers 5.17's GPT2Tokenizer(vocab_file=..., merges_file=...) silently loads an empty vocabulary)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    bpe = models.BPE.from_file(str(d / "encoder.json"), str(d / "vocab.bpe"), dropout=None,
                               continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    raw = tokenizers.Tokenizer(bpe)
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.post_processor = processors.ByteLevel(trim_offsets=False)
    raw.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    hf = None
    try:  # transformers' own GPT-2 class, if this version loads the files correctly
        try:
            from transformers import GPT2TokenizerFast as GPT2
        except ImportError:
            from transformers import GPT2Tokenizer as GPT2
        candidate = GPT2(vocab_file=str(d / "encoder.json"), merges_file=str(d / "vocab.bpe"))
        if len(candidate) == raw.get_vocab_size(with_added_tokens=True) and \
                candidate("Hello world")["input_ids"] == raw.encode("Hello world").ids:
            hf = candidate
    except Exception as e:  # noqa: BLE001 - any failure means: use the `tokenizers` pipeline
        print(f"gpt2: transformers' GPT-2 class unusable here ({type(e).__name__}: {e})", file=sys.stderr)
    if hf is None:
        print("gpt2: transformers did not load encoder.json + vocab.bpe; hf_* fields come from the "
              "`tokenizers` pipeline", file=sys.stderr)
        hf = RawAsTransformers(raw, "<|endoftext|>")
    return raw, hf


def load(name, data):
    """(raw `tokenizers.Tokenizer`, transformers tokenizer) for one data/tokenizers/<name> directory."""
    d = data / name
    if (d / "tokenizer.json").exists():
        raw = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
        hf = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
        return raw, hf
    return gpt2_reference(d)


def golden_tokens(name, data, texts, texts_sha, out_dir):
    raw, hf = load(name, data)
    source = (data / name / "SOURCE").read_text().strip() if (data / name / "SOURCE").exists() else ""
    meta = {
        "name": name, "source": source, "texts_sha256": texts_sha,
        "tokenizers_version": tokenizers.__version__, "transformers_version": transformers.__version__,
        "hf_class": type(hf).__name__,
        "hf_clean_up_tokenization_spaces": bool(getattr(hf, "clean_up_tokenization_spaces", False)),
        "vocab_size": raw.get_vocab_size(with_added_tokens=True), "hf_len": len(hf),
        "bos_token": hf.bos_token, "eos_token": hf.eos_token, "bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id,
    }
    lines = []
    for i, text in enumerate(texts):
        ids = raw.encode(text, add_special_tokens=False).ids
        ids_special = raw.encode(text, add_special_tokens=True).ids
        lines.append({
            "i": i,
            "ids": ids,
            "ids_special": ids_special,
            "decoded": raw.decode(ids, skip_special_tokens=False),
            "decoded_skip": raw.decode(ids_special, skip_special_tokens=True),
            "hf_ids_special": hf(text)["input_ids"],
            "hf_decoded": hf.decode(ids),
        })
        hf_ids = hf(text, add_special_tokens=False)["input_ids"]
        if hf_ids != ids:
            lines[-1]["hf_ids"] = hf_ids
    # Texts where transformers' own pipeline disagrees with tokenizer.json (a transformers version that
    # rebuilds the tokenizer from its class): the C++ test then skips the transformers (hf_*) comparisons.
    meta["hf_ids_differ"] = sum(1 for line in lines if "hf_ids" in line)
    path = out_dir / f"golden_{name}.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write(dump({"meta": meta}))
        for line in lines:
            f.write(dump(line))
    print(f"{path}: {len(texts)} texts ({meta['hf_class']}, tokenizers {meta['tokenizers_version']}, "
          f"transformers {meta['transformers_version']}; transformers differs from tokenizer.json on "
          f"{meta['hf_ids_differ']} texts)")


def golden_chat(data, fixtures, out_dir):
    conversations = json.loads((fixtures / "conversations.json").read_text(encoding="utf-8"))
    path = out_dir / "golden_chat.jsonl"
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for template_name, template_file, tok_name in TEMPLATES:
            if not (data / tok_name).exists():
                print(f"skip chat template {template_name}: no {data / tok_name}", file=sys.stderr)
                continue
            raw, hf = load(tok_name, data)
            if template_file is None:
                template = hf.chat_template
                source = f"data:{tok_name}/tokenizer_config.json"
            else:
                template = (fixtures / template_file).read_text(encoding="utf-8")
                if template.endswith("\n"):
                    template = template[:-1]
                source = template_file
            thinking = [None, True, False] if template_name == "qwen3" else [None]
            for conv in conversations:
                for agp in (True, False):
                    for et in thinking:
                        kwargs = {} if et is None else {"enable_thinking": et}
                        line = {"template": template_name, "template_file": source, "tokenizer": tok_name,
                                "conversation": conv["name"], "add_generation_prompt": agp, "enable_thinking": et,
                                "bos_token": hf.bos_token, "eos_token": hf.eos_token}
                        try:
                            text = hf.apply_chat_template(conv["messages"], chat_template=template, tokenize=False,
                                                          add_generation_prompt=agp, **kwargs)
                            line["text"] = text
                            line["ids"] = raw.encode(text, add_special_tokens=False).ids
                        except Exception as e:  # recorded: the C++ renderer must refuse the same inputs
                            line["error"] = f"{type(e).__name__}: {e}"
                        f.write(dump(line))
                        count += 1
    print(f"{path}: {count} renderings")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT / "data" / "tokenizers"), help="fetched tokenizer directories")
    parser.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures" / "tokenizer"), help="texts and conversations")
    parser.add_argument("--out", default=None, help="where the golden files go (default: --fixtures)")
    parser.add_argument("--names", default=",".join(NAMES), help="tokenizers to do (comma-separated)")
    args = parser.parse_args()
    data, fixtures = pathlib.Path(args.data), pathlib.Path(args.fixtures)
    out_dir = pathlib.Path(args.out) if args.out else fixtures
    out_dir.mkdir(parents=True, exist_ok=True)

    raw_texts = (fixtures / "texts.jsonl").read_bytes()
    texts = [json.loads(line) for line in raw_texts.decode("utf-8").split("\n") if line.strip()]
    texts_sha = hashlib.sha256(raw_texts).hexdigest()
    missing = [n for n in args.names.split(",") if not (data / n).exists()]
    if missing:
        sys.exit(f"missing {', '.join(str(data / n) for n in missing)}: run scripts/fetch-tokenizers.sh where there is "
                 "network and copy data/tokenizers here")
    for name in args.names.split(","):
        golden_tokens(name, data, texts, texts_sha, out_dir)
    golden_chat(data, fixtures, out_dir)


if __name__ == "__main__":
    main()
