#!/usr/bin/env python3
"""Golden files for microLLM's tokenizer tests, from Hugging Face `tokenizers` and `transformers`.

Run where both libraries are installed; no network is used (the tokenizer files are paths):

    scripts/fetch-tokenizers.sh                      # on a machine with network: fills data/tokenizers/
    python3 tools/oracle/tokenizer_golden.py         # where tokenizers + transformers are installed

Inputs (relative to the repository root unless given):
  data/tokenizers/<name>/          tokenizer.json + tokenizer_config.json (qwen3, llama3, deepseek_v3, llama2,
                                   gemma3, o200k), encoder.json + vocab.bpe (gpt2)
  tests/fixtures/tokenizer/texts.jsonl, texts_byte_fallback.jsonl   one JSON string per line
  tests/fixtures/tokenizer/decode_cases.json     id sequences to decode, as token texts
  tests/fixtures/tokenizer/variants.json         tokenizers made from a fetched tokenizer.json with some
                                                 top-level parts replaced (llama2_metaspace, ...)
  tests/fixtures/tokenizer/conversations.json    [{"name", "messages"}]
  tests/fixtures/tokenizer/templates/*.jinja     Qwen2.5-Instruct and DeepSeek-R1-Distill-Qwen templates

Outputs (tests/fixtures/tokenizer/):
  golden_<name>.jsonl   line 1: {"meta": {...}}; then one line per text of meta.texts_files (a variant takes
    only the first meta.texts_lines[file] lines of a file):
      {"i", "ids": encode(add_special_tokens=False), "ids_special": encode(add_special_tokens=True),
       "decoded": decode(ids), "decoded_skip": decode(ids_special, skip_special_tokens=True),
       "hf_ids_special": transformers tokenizer(text).input_ids, "hf_decoded": transformers decode(ids),
       "hf_ids": transformers tokenizer(text, add_special_tokens=False).input_ids, only where it differs from ids}
    then one line per case of decode_cases.json whose tokens are all in the vocabulary:
      {"case", "decode_ids", "decoded": decode(ids), "decoded_skip": decode(ids, skip_special_tokens=True)}
    (ids/decoded: the `tokenizers` library on tokenizer.json; hf_*: transformers' AutoTokenizer on the
    directory, which also applies tokenizer_config.json; variants and tokenizers transformers cannot load
    have no hf_* fields and meta.hf_class null). tools/oracle/tokenizer_golden_node.mjs writes the same
    files, without hf_* fields, from the same Rust library through Node.js.
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
NAMES = ["qwen3", "llama3", "deepseek_v3", "gpt2", "llama2", "gemma3", "o200k",
         "llama2_metaspace", "llama2_metaspace_split", "llama2_metaspace_never", "llama2_unigram"]
TEXT_FILES = ["texts.jsonl", "texts_byte_fallback.jsonl"]

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


def load_reference(name, data, variants):
    """(raw, transformers tokenizer or None, variant or None): a variant is its base's tokenizer.json with
    the top-level parts of its overrides replaced, for which transformers has no folder to load."""
    variant = variants.get(name)
    if variant is not None:
        spec = json.loads((data / variant["base"] / "tokenizer.json").read_text(encoding="utf-8"))
        spec.update(variant["overrides"])
        if "unigram_from_vocab" in variant:  # the piece of id i scored -(i + 1) / 1000
            pieces = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
            assert [i for _, i in pieces] == list(range(len(pieces))), "unigram_from_vocab needs ids 0..n-1"
            settings = variant["unigram_from_vocab"]
            spec["model"] = {"type": "Unigram", "unk_id": settings["unk_id"], "byte_fallback": settings["byte_fallback"],
                             "vocab": [[piece, -(i + 1) / 1000] for piece, i in pieces]}
        return tokenizers.Tokenizer.from_str(json.dumps(spec)), None, variant
    try:
        raw, hf = load(name, data)
    except Exception as e:  # noqa: BLE001 - transformers may not load every class offline: keep the raw results
        print(f"{name}: transformers could not load it ({type(e).__name__}: {e}); no hf_* fields", file=sys.stderr)
        raw, hf = tokenizers.Tokenizer.from_file(str(data / name / "tokenizer.json")), None
    return raw, hf, variant


def config_token(config, key):
    value = config.get(key)
    return value if isinstance(value, str) or value is None else value.get("content")


def case_ids(raw, tokens, config):
    """The ids of one decode_cases.json case in this vocabulary, or None when a token is not there."""
    byte_fallback = raw.token_to_id("<0x41>") is not None

    def byte_level_char(b):  # GPT-2's byte alphabet
        printable = [x for x in range(256) if 0x21 <= x <= 0x7E or 0xA1 <= x <= 0xAC or 0xAE <= x <= 0xFF]
        return chr(b) if b in printable else chr(0x100 + [x for x in range(256) if x not in printable].index(b))

    ids = []
    for t in tokens:
        if isinstance(t, dict) and "byte" in t:
            t = "<0x%02X>" % t["byte"] if byte_fallback else byte_level_char(t["byte"])
        elif isinstance(t, dict) and "special" in t:
            t = config_token(config, t["special"] + "_token")
        token_id = None if t is None else raw.token_to_id(t)
        if token_id is None:
            return None
        ids.append(token_id)
    return ids


def golden_tokens(name, data, fixtures, variants, out_dir):
    raw, hf, variant = load_reference(name, data, variants)
    base = variant["base"] if variant else name
    texts_lines = variant.get("texts_lines", {}) if variant else {}
    texts = []
    for file in TEXT_FILES:
        part = [json.loads(line) for line in (fixtures / file).read_text(encoding="utf-8").split("\n") if line.strip()]
        texts += part[:texts_lines.get(file, len(part))]
    config_path = data / base / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
    source = (data / base / "SOURCE").read_text().strip() if (data / base / "SOURCE").exists() else ""
    meta = {
        "name": name, "source": source, "texts_files": TEXT_FILES,
        "texts_sha256": {f: hashlib.sha256((fixtures / f).read_bytes()).hexdigest() for f in TEXT_FILES},
        "texts": len(texts),
        "oracle": f"Python tokenizers {tokenizers.__version__}, transformers {transformers.__version__}",
        "tokenizers_version": tokenizers.__version__, "transformers_version": transformers.__version__,
        "hf_class": type(hf).__name__ if hf is not None else None,
        "vocab_size": raw.get_vocab_size(with_added_tokens=True),
        "bos_token": config_token(config, "bos_token"), "eos_token": config_token(config, "eos_token"),
    }
    if variant:
        meta.update({"base": variant["base"], "about": variant["about"], "overrides": variant["overrides"]})
        if "unigram_from_vocab" in variant:
            meta["unigram_from_vocab"] = variant["unigram_from_vocab"]
        if texts_lines:
            meta["texts_lines"] = texts_lines
    if hf is not None:
        meta.update({
            "hf_clean_up_tokenization_spaces": bool(getattr(hf, "clean_up_tokenization_spaces", False)),
            "hf_len": len(hf), "bos_token": hf.bos_token, "eos_token": hf.eos_token,
            "bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id,
        })
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
        })
        if hf is None:
            continue
        lines[-1]["hf_ids_special"] = hf(text)["input_ids"]
        lines[-1]["hf_decoded"] = hf.decode(ids)
        hf_ids = hf(text, add_special_tokens=False)["input_ids"]
        if hf_ids != ids:
            lines[-1]["hf_ids"] = hf_ids
    cases = json.loads((fixtures / "decode_cases.json").read_text(encoding="utf-8"))["cases"]
    for case in cases:
        ids = case_ids(raw, case["tokens"], config)
        if ids is not None:
            lines.append({"case": case["name"], "decode_ids": ids,
                          "decoded": raw.decode(ids, skip_special_tokens=False),
                          "decoded_skip": raw.decode(ids, skip_special_tokens=True)})
    meta["decode_cases"] = len(lines) - len(texts)
    # Texts where transformers' own pipeline disagrees with tokenizer.json (a transformers version that
    # rebuilds the tokenizer from its class): the C++ test then skips the transformers (hf_*) comparisons.
    meta["hf_ids_differ"] = sum(1 for line in lines if "hf_ids" in line)
    path = out_dir / f"golden_{name}.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write(dump({"meta": meta}))
        for line in lines:
            f.write(dump(line))
    print(f"{path}: {len(texts)} texts, {meta['decode_cases']} decode cases ({meta['hf_class']}, "
          f"tokenizers {meta['tokenizers_version']}, "
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

    variants = json.loads((fixtures / "variants.json").read_text(encoding="utf-8"))["variants"]
    names = args.names.split(",")
    missing = sorted({variants[n]["base"] if n in variants else n for n in names} -
                     {n for n in os.listdir(data) if (data / n).is_dir()} if data.exists() else set(names))
    if missing:
        sys.exit(f"missing {', '.join(str(data / n) for n in missing)}: run scripts/fetch-tokenizers.sh where there is "
                 "network and copy data/tokenizers here")
    for name in names:
        golden_tokens(name, data, fixtures, variants, out_dir)
    golden_chat(data, fixtures, out_dir)


if __name__ == "__main__":
    main()
