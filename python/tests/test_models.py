"""Models, tokenizers and generation from Python against the `microllm` command on the same inputs.

The committed tiny models (tests/fixtures/models/*: random weights, no tokenizer, so text is bytes) give logits
equal to `microllm logits` and text equal to `microllm generate`, greedy and sampled with a seed; a copy of the
Qwen2 one with a byte-level tokenizer.json and the Qwen2.5 chat template checks chat generation; the fetched Qwen3
tokenizer (data/tokenizers/qwen3, scripts/fetch-tokenizers.sh; skipped when absent) checks encode/decode against
the golden file and apply_chat_template against `microllm template`. Random inputs come from a fresh seed that
each test prints (pytest shows it on failure); MICROLLM_TEST_SEED=N repeats a run.
"""
import json
import os
import random
import shutil
import struct
import subprocess
import threading
import time
import _thread
from pathlib import Path

import numpy as np
import pytest

import microllm

SOURCE_DIR = Path(os.environ.get("MICROLLM_SOURCE_DIR", Path(__file__).resolve().parents[2]))
MICROLLM_BIN = os.path.abspath(os.environ["MICROLLM_BIN"]) if os.environ.get("MICROLLM_BIN") else None
FIXTURE_MODELS = SOURCE_DIR / "tests" / "fixtures" / "models"
FAMILIES = ["qwen2", "qwen3", "llama3", "mistral", "llama_linear"]
QWEN3_TOKENIZER = SOURCE_DIR / "data" / "tokenizers" / "qwen3"
CHAT_TEMPLATES = SOURCE_DIR / "tests" / "fixtures" / "chat_templates"

needs_cli = pytest.mark.skipif(not MICROLLM_BIN, reason="MICROLLM_BIN (the built `microllm` command) is not set")
needs_qwen3 = pytest.mark.skipif(not (QWEN3_TOKENIZER / "tokenizer.json").exists(),
                                 reason="no data/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")


@pytest.fixture
def rng():
    seed = int(os.environ.get("MICROLLM_TEST_SEED", random.SystemRandom().randrange(2**31)))
    print(f"random seed: {seed} (MICROLLM_TEST_SEED={seed} repeats it)")
    return random.Random(seed)


def run_cli(*args):
    return subprocess.run([MICROLLM_BIN, *map(str, args)], capture_output=True, cwd=SOURCE_DIR)


def cli(*args):
    """stdout of `microllm ARGS` as bytes; a failure shows its stderr."""
    done = run_cli(*args)
    assert done.returncode == 0, f"microllm {' '.join(map(str, args))} failed:\n{done.stderr.decode(errors='replace')}"
    return done.stdout


def read_safetensors(path):
    """name -> ndarray of a safetensors file (F32 and I64, the ones `microllm logits` writes)."""
    raw = Path(path).read_bytes()
    (header_size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_size])
    data = raw[8 + header_size:]
    kinds = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=kinds[entry["dtype"]]).reshape(entry["shape"])
    return out


def as_numpy(tensor):
    """A microllm.Tensor's values (NumPy's buffer protocol, else tolist())."""
    try:
        array = np.asarray(tensor)
        if array.dtype != object and array.shape == tuple(tensor.shape):
            return array
    except (TypeError, ValueError, RuntimeError):
        pass
    if hasattr(tensor, "tolist"):
        return np.array(tensor.tolist(), dtype=np.float32)
    pytest.skip("microllm.Tensor offers no values to Python yet")


def cli_text(text):
    """What the command prints for a generated text: its bytes and a newline."""
    return text.encode("utf-8", "surrogateescape") + b"\n"


@pytest.fixture(scope="module")
def models():
    return {family: microllm.load_model(str(FIXTURE_MODELS / family)) for family in FAMILIES}


def byte_char(b):
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others from U+0100 on."""
    printable = [x for x in range(256) if 0x21 <= x <= 0x7E or 0xA1 <= x <= 0xAC or 0xAE <= x <= 0xFF]
    if b in printable:
        return chr(b)
    return chr(0x100 + [x for x in range(256) if x not in printable].index(b))


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """The Qwen2 fixture with a byte-level tokenizer (ids 0..255, <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258),
    the Qwen2.5 chat template and a generation_config.json that samples and stops at 258 and 256."""
    folder = tmp_path_factory.mktemp("chat-model")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE_MODELS / "qwen2" / name, folder / name)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, 256], "do_sample": True}))

    def added(token_id, content):
        return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}

    tokenizer = {
        "version": "1.0",
        "added_tokens": [added(256, "<|endoftext|>"), added(257, "<|im_start|>"), added(258, "<|im_end|>")],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {byte_char(b): b for b in range(256)}, "merges": []},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer"}))
    shutil.copy(CHAT_TEMPLATES / "templates" / "qwen2.5-instruct.jinja", folder / "chat_template.jinja")
    return folder


def random_text(rng, length):
    alphabet = "abcdefghij klmnop,.\n" + "éü日本"
    return "".join(rng.choice(alphabet) for _ in range(length))


# ---- loading ----


def test_load_model_reads_the_config(models):
    for family, model in models.items():
        config = json.loads((FIXTURE_MODELS / family / "config.json").read_text())
        assert model.config.model_type == config["model_type"]
        assert model.config.vocab_size == config["vocab_size"]
        assert model.config.hidden_size == config["hidden_size"]
        assert model.config.num_layers == config["num_hidden_layers"]
        assert model.config.num_heads == config["num_attention_heads"]
        assert model.config.to_dict()["num_kv_heads"] == config["num_key_value_heads"]
        assert model.device == "cpu" and model.dtype == "f32"
        assert model.tokenizer is None
        assert model.num_parameters == model.config.num_parameters > 0


def test_a_sliding_window_reads_from_config_json_and_hides_older_keys(tmp_path, rng):
    # The mistral fixture with a 5-key window: the same logits while a sequence fits the window, others after.
    folder = tmp_path / "mistral-window"
    shutil.copytree(FIXTURE_MODELS / "mistral", folder)
    config = json.loads((folder / "config.json").read_text())
    config["sliding_window"] = 5
    (folder / "config.json").write_text(json.dumps(config))
    full, windowed = microllm.load_model(str(FIXTURE_MODELS / "mistral")), microllm.load_model(str(folder))
    assert full.config.layer_windows == [0, 0]
    assert windowed.config.layer_windows == [5, 5] == windowed.config.to_dict()["layer_windows"]
    ids = [[rng.randrange(config["vocab_size"]) for _ in range(12)]]
    a, b = as_numpy(full.logits(ids))[0], as_numpy(windowed.logits(ids))[0]
    np.testing.assert_array_equal(a[:5], b[:5])
    assert np.abs(a[5:] - b[5:]).max() > 1e-4


def test_a_missing_folder_raises_io_error_naming_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(microllm.IoError, match=str(missing)):
        microllm.load_model(str(missing))
    with pytest.raises(OSError):  # IoError is an OSError for Python code
        microllm.load_model(str(missing))
    with pytest.raises(microllm.IoError, match="no-such-tokenizer"):
        microllm.Tokenizer(str(tmp_path / "no-such-tokenizer"))


def test_bad_arguments_raise(models):
    model = models["qwen2"]
    with pytest.raises(microllm.ValueError, match="outside the vocabulary"):
        model.logits([[1, 2, model.config.vocab_size]])
    with pytest.raises(microllm.ShapeError, match="same length"):
        model.logits([[1, 2, 3], [4, 5]])
    with pytest.raises(microllm.ValueError, match="dtype"):
        microllm.load_model(str(FIXTURE_MODELS / "qwen2"), dtype="f16")
    with pytest.raises(microllm.ValueError, match="chat"):
        model.generate("hi", chat=True)  # no tokenizer


# ---- logits, taps, attention weights ----


@needs_cli
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_the_cli(models, family, rng, tmp_path):
    model = models[family]
    batch, length = rng.randint(1, 3), rng.randint(1, 24)
    ids = [[rng.randrange(model.config.vocab_size) for _ in range(length)] for _ in range(batch)]
    out = tmp_path / "logits.safetensors"
    cli("logits", "--model", FIXTURE_MODELS / family, "--ids", ";".join(",".join(map(str, r)) for r in ids),
        "--out", out, "--greedy", 12)
    golden = read_safetensors(out)
    logits = model.logits(ids)
    assert tuple(logits.shape) == (batch, length, model.config.vocab_size)
    assert logits.dtype == "f32"
    np.testing.assert_array_equal(as_numpy(logits), golden["logits"])
    # The CLI's greedy continuation has no stop ids: Model.generate's (which stops at the folder's) is a prefix.
    result = model.generate(ids[0], max_tokens=12, temperature=0, details=True)
    expected = golden["greedy_tokens"].tolist()
    assert result.token_ids == expected[:len(result.token_ids)]
    assert result.finish_reason in ("length", "eos")


def test_ids_in_every_form_give_the_same_logits(models, rng):
    model = models["llama3"]
    rows = [[rng.randrange(model.config.vocab_size) for _ in range(7)] for _ in range(2)]
    reference = as_numpy(model.logits(rows))
    np.testing.assert_array_equal(as_numpy(model.logits(np.array(rows, dtype=np.int64))), reference)
    np.testing.assert_array_equal(as_numpy(model.logits(np.array(rows, dtype=np.int32))), reference)
    # One row alone: OpenBLAS may pick another kernel for another shape, so the last bits may differ.
    np.testing.assert_allclose(as_numpy(model.logits(rows[1]))[0], reference[1], rtol=0, atol=1e-4)
    assert tuple(model.logits(tuple(rows[0])).shape) == (1, 7, model.config.vocab_size)


def test_taps_and_attention_weights(models, rng):
    model = models["qwen3"]
    length = rng.randint(2, 12)
    ids = [[rng.randrange(model.config.vocab_size) for _ in range(length)]]
    taps = model.taps(ids, ["model.layers.0.*", "model.layers.0", "logits"])
    assert "model.layers.0.self_attn.q_norm" in taps  # Qwen3's QK-norm
    assert all(name.startswith("model.layers.0") or name == "logits" for name in taps)
    assert tuple(taps["model.layers.0"].shape) == (1, length, model.config.hidden_size)
    np.testing.assert_allclose(as_numpy(taps["logits"]), as_numpy(model.logits(ids)), rtol=0, atol=1e-6)
    every = model.taps(ids)
    assert f"model.layers.{model.config.num_layers - 1}" in every and "model.norm" in every
    assert not any("attn_weights" in name for name in every)  # only a pattern naming them selects them

    weights = model.attention_weights(ids, [0, model.config.num_layers - 1])
    assert len(weights) == 2
    for w in weights:
        assert tuple(w.shape) == (1, model.config.num_heads, length, length)
        probs = as_numpy(w)
        np.testing.assert_allclose(probs.sum(-1), 1, atol=1e-5)
        assert np.all(np.triu(probs, k=1) == 0)  # causal
    tapped = model.taps(ids, ["*attn_weights"])
    np.testing.assert_allclose(as_numpy(tapped["model.layers.0.self_attn.attn_weights"]), as_numpy(weights[0]),
                               atol=1e-6)


# ---- generation ----


@needs_cli
@pytest.mark.parametrize("family", ["qwen2", "llama3", "mistral"])
def test_generate_equals_the_cli(models, family, rng):
    model = models[family]
    prompt = random_text(rng, rng.randint(1, 12))
    seed = rng.randrange(2**32)
    folder = FIXTURE_MODELS / family
    greedy = model.generate(prompt, max_tokens=40, temperature=0)
    assert cli("generate", "--model", folder, "--prompt", prompt, "--no-echo", "--max-tokens", 40,
               "--temperature", 0) == cli_text(greedy)
    sampled = model.generate(prompt, max_tokens=40, temperature=1.3, top_k=50, top_p=0.95, min_p=0.01,
                             repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.1, seed=seed)
    assert cli("generate", "--model", folder, "--prompt", prompt, "--no-echo", "--max-tokens", 40,
               "--temperature", 1.3, "--top-k", 50, "--top-p", 0.95, "--min-p", 0.01, "--repetition-penalty", 1.1,
               "--presence-penalty", 0.2, "--frequency-penalty", 0.1, "--seed", seed) == cli_text(sampled)
    # Defaults: the CLI's (temperature 0.8, seed 0, 200 tokens).
    assert cli("generate", "--model", folder, "--prompt", prompt, "--no-echo") == cli_text(model.generate(prompt))
    # A stop string cuts the text before it (one a command line can carry: no NUL, which a random model may sample).
    stop = next((sampled[i:i + 2] for i in range(5, len(sampled) - 1) if "\0" not in sampled[i:i + 2]), "zz")
    stopped = model.generate(prompt, max_tokens=40, temperature=1.3, seed=seed, stop=[stop], details=True)
    assert stop not in stopped.text
    assert cli("generate", "--model", folder, "--prompt", prompt, "--no-echo", "--max-tokens", 40,
               "--temperature", 1.3, "--seed", seed, "--stop", stop.replace("\\", "\\\\")) == cli_text(stopped.text)


@needs_cli
def test_chat_generation_equals_the_cli(chat_model_dir, rng):
    model = microllm.load_model(str(chat_model_dir))
    assert model.tokenizer is not None and model.tokenizer.eos_token == "<|im_end|>"
    question = random_text(rng, rng.randint(1, 20))
    seed = rng.randrange(2**32)
    # generation_config.json asks to sample (temperature 0.8, the CLI's default) and stops at <|im_end|>.
    text = model.generate(question, chat=True, system="Be brief.", max_tokens=30, seed=seed)
    assert cli("generate", "--model", chat_model_dir, "--prompt", question, "--chat", "--system", "Be brief.",
               "--max-tokens", 30, "--seed", seed) == cli_text(text)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
    assert model.generate(messages, chat=True, max_tokens=30, seed=seed) == text
    plain = model.generate(question, max_tokens=30, temperature=0)
    assert cli("generate", "--model", chat_model_dir, "--prompt", question, "--no-echo", "--max-tokens", 30,
               "--temperature", 0) == cli_text(plain)


@pytest.mark.parametrize("family", ["qwen2", "llama_linear"])
def test_streamed_pieces_make_the_text(models, family, rng):
    model = models[family]
    prompt = random_text(rng, 5)
    seed = rng.randrange(2**32)
    whole = model.generate(prompt, max_tokens=60, temperature=1.0, seed=seed, details=True)
    stream = model.generate(prompt, max_tokens=60, temperature=1.0, seed=seed, stream=True)
    assert stream.result is None
    pieces = list(stream)
    assert all(isinstance(piece, str) and piece for piece in pieces)
    assert "".join(pieces) == whole.text
    assert stream.finished
    assert stream.result.token_ids == whole.token_ids
    assert stream.result.finish_reason == whole.finish_reason


def test_a_closed_stream_stops(models):
    stream = models["qwen2"].generate("abc", max_tokens=200, temperature=1.0, stream=True)
    next(iter(stream), None)
    stream.close()
    rest = list(stream)  # what was decoded before it stopped, then the end
    assert stream.finished and stream.result.finish_reason in ("callback", "length", "eos", "context")
    assert all(isinstance(piece, str) for piece in rest)
    stream = models["qwen2"].generate("abc", max_tokens=200, temperature=1.0, stream=True)
    del stream  # dropping a running stream stops its worker too
    models["qwen2"].generate("abc", max_tokens=200, temperature=1.0, stream=True)


@pytest.fixture
def long_window_model(tmp_path):
    """The Qwen2 fixture with a window of 100000 tokens and no stop ids: a generation as long as asked."""
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE_MODELS / "qwen2" / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_position_embeddings"] = 100000
    (tmp_path / "config.json").write_text(json.dumps(config))
    return microllm.load_model(str(tmp_path))


def interrupt_after(seconds):
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    return timer


def test_ctrl_c_stops_a_long_generation(long_window_model):
    start = time.monotonic()
    timer = interrupt_after(0.3)
    with pytest.raises(KeyboardInterrupt):
        long_window_model.generate("x", max_tokens=50000, temperature=0)
    timer.join()
    assert time.monotonic() - start < 20  # 50000 tokens would take minutes
    # The model still works afterwards.
    assert len(long_window_model.generate("x", max_tokens=5, temperature=0, details=True).token_ids) == 5


def test_ctrl_c_stops_a_stream(long_window_model):
    stream = long_window_model.generate("x", max_tokens=50000, temperature=1.0, stream=True)
    timer = interrupt_after(0.3)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        for _ in stream:
            pass
    timer.join()
    assert time.monotonic() - start < 20


def test_generate_releases_the_gil(long_window_model):
    """Python threads run while the model computes: a counter in this thread advances during a generation."""
    done = threading.Event()
    worker = threading.Thread(target=lambda: (long_window_model.generate("x", max_tokens=1500, temperature=0),
                                              done.set()))
    worker.start()
    count = 0
    while not done.is_set() and count < 10**7:
        count += 1
    worker.join()
    assert count > 10000, f"this thread ran only {count} loop iterations during the generation"


# ---- the engine (LLM) ----


def test_llm_generate_equals_model_generate(chat_model_dir, rng):
    llm = microllm.LLM(str(chat_model_dir), max_batch=4)
    prompts = [random_text(rng, rng.randint(1, 30)) for _ in range(rng.randint(3, 7))]
    params = microllm.SamplingParams(temperature=0, max_tokens=rng.randint(5, 40))
    outputs = llm.generate(prompts, params)
    assert len(outputs) == len(prompts)
    for prompt, out in zip(prompts, outputs):
        alone = llm.model.generate(prompt, max_tokens=params.max_tokens, temperature=0, details=True)
        assert out.prompt == prompt
        assert out.prompt_token_ids == llm.tokenizer.encode(prompt)
        assert out.text == alone.text, prompt
        assert out.token_ids == alone.token_ids
        assert out.finish_reason == {"length": "length", "eos": "stop", "context": "length"}[alone.finish_reason]
        assert out.outputs[0].text == out.text
    assert llm.stats()["prompt_tokens"] == sum(len(o.prompt_token_ids) for o in outputs)


def test_llm_stop_strings_and_seeds(models, rng):
    llm = microllm.LLM(models["mistral"], max_batch=2)
    prompt = random_text(rng, 6)
    seed = rng.randrange(2**32)
    sampled = llm.generate([prompt] * 3, microllm.SamplingParams(temperature=1.0, max_tokens=30, seed=seed))
    assert sampled[0].text == sampled[1].text == sampled[2].text  # the same seed, the same text
    greedy = llm.generate(prompt, microllm.SamplingParams(temperature=0, max_tokens=30))[0]
    if len(greedy.text) >= 4:
        stop = greedy.text[2:4]
        cut = llm.generate(prompt, microllm.SamplingParams(temperature=0, max_tokens=30, stop=stop))[0]
        assert cut.text == greedy.text[:greedy.text.index(stop)]
        assert cut.finish_reason == "stop"
        assert cut.text == llm.model.generate(prompt, max_tokens=30, temperature=0, stop=[stop])
    with pytest.raises(microllm.ValueError):
        llm.generate(["a"], microllm.SamplingParams(temperature=-1))


def test_ctrl_c_stops_the_engine(long_window_model):
    llm = microllm.LLM(long_window_model, max_batch=2)
    params = microllm.SamplingParams(temperature=0, max_tokens=20000, ignore_eos=True)
    timer = interrupt_after(0.3)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["a", "b"], params)
    timer.join()
    assert time.monotonic() - start < 20
    # The cancelled requests left: the engine runs the next ones.
    out = llm.generate(["a"], microllm.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


# ---- tokenizers and chat templates ----


@needs_qwen3
def test_tokenizer_matches_the_golden_file():
    tokenizer = microllm.Tokenizer(str(QWEN3_TOKENIZER / "tokenizer.json"))  # the golden's reference: the file alone
    lines = [json.loads(line) for line in (SOURCE_DIR / "tests/fixtures/tokenizer/golden_qwen3.jsonl").open()]
    meta = lines[0]["meta"]
    texts = [json.loads(line) for line in (SOURCE_DIR / "tests/fixtures/tokenizer/texts.jsonl").open()]
    assert tokenizer.vocab_size == meta["vocab_size"] == len(tokenizer)
    checked = 0
    for text, golden in zip(texts, lines[1:]):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate in JSON: not text the tokenizer takes
            continue
        assert tokenizer.encode(text, add_special_tokens=False) == golden["ids"], text
        assert tokenizer.encode(text) == golden["ids_special"], text
        assert tokenizer.decode(golden["ids"]) == golden["decoded"], text
        assert tokenizer.decode(golden["ids_special"], skip_special_tokens=True) == golden["decoded_skip"], text
        checked += 1
    assert checked > 400
    batch = texts[10:20]
    assert tokenizer.encode_batch(batch) == [tokenizer.encode(t) for t in batch]
    assert tokenizer.decode_batch(tokenizer.encode_batch(batch)) == batch
    for case in lines[1 + len(texts):]:
        assert tokenizer.decode(case["decode_ids"]) == case["decoded"], case["case"]
    full = microllm.Tokenizer.from_pretrained(str(QWEN3_TOKENIZER))
    assert full.eos_token == meta["eos_token"] and full.eos_token_id == meta["eos_token_id"]
    assert full.bos_token is None and full.bos_token_id is None
    assert full.token_to_id("<|im_end|>") == 151645 and full.id_to_token(151645) == "<|im_end|>"
    assert full.token_to_id("no such token") is None and full.id_to_token(10**9) is None


def check_templates_against_cli(folder, tokenizer, conversations, tools_sets, tmp_path):
    checked = 0
    for group in ("basic", "thinking", "tools"):
        for conversation in conversations.get(group, []):
            for add_generation_prompt in (False, True):
                messages_file = tmp_path / "messages.json"
                messages_file.write_text(json.dumps(conversation["messages"]))
                args = ["template", "--model", folder, "--messages", messages_file]
                kwargs = dict(conversation.get("variables", {}))
                tools = None
                if "tools" in conversation:
                    tools = tools_sets[conversation["tools"]]
                    (tmp_path / "tools.json").write_text(json.dumps(tools))
                    args += ["--tools", tmp_path / "tools.json"]
                if add_generation_prompt:
                    args.append("--add-generation-prompt")
                for name, value in kwargs.items():
                    args += ["--var", f"{name}={json.dumps(value)}"]
                try:
                    text = tokenizer.apply_chat_template(conversation["messages"],
                                                         add_generation_prompt=add_generation_prompt, tools=tools,
                                                         **kwargs)
                except microllm.ValueError as error:  # what the template raises, the command reports the same way
                    done = run_cli(*args)
                    assert done.returncode != 0 and str(error) in done.stderr.decode(), conversation["name"]
                    continue
                assert text.encode() == cli(*args), (conversation["name"], add_generation_prompt)
                ids = tokenizer.apply_chat_template(conversation["messages"], add_generation_prompt=add_generation_prompt,
                                                    tools=tools, tokenize=True, **kwargs)
                assert ids == tokenizer.encode(text, add_special_tokens=False)
                checked += 1
    return checked


@needs_cli
@needs_qwen3
def test_qwen3_chat_template_equals_the_cli(tmp_path):
    conversations = json.loads((CHAT_TEMPLATES / "conversations.json").read_text())
    tokenizer = microllm.Tokenizer.from_pretrained(str(QWEN3_TOKENIZER))
    assert check_templates_against_cli(QWEN3_TOKENIZER, tokenizer, conversations, conversations["tool_sets"],
                                       tmp_path) >= 20
    # transformers' own renderings of the same template (tests/fixtures/chat_templates/golden.jsonl).
    by_name = {c["name"]: c for group in conversations.values() if isinstance(group, list) for c in group}
    golden = [json.loads(line) for line in (CHAT_TEMPLATES / "golden.jsonl").open()]
    compared = 0
    for case in (g for g in golden if g["template"] == "qwen3" and "text" in g):
        conversation = by_name[case["conversation"]]
        tools = conversations["tool_sets"][conversation["tools"]] if "tools" in conversation else None
        assert tokenizer.apply_chat_template(conversation["messages"], add_generation_prompt=case["add_generation_prompt"],
                                             tools=tools, **conversation.get("variables", {})) == case["text"]
        compared += 1
    assert compared >= 20
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                         enable_thinking=False)
    assert text.endswith("<think>\n\n</think>\n\n")


@needs_cli
def test_model_folder_chat_template_equals_the_cli(chat_model_dir, tmp_path):
    conversations = json.loads((CHAT_TEMPLATES / "conversations.json").read_text())
    tokenizer = microllm.load_model(str(chat_model_dir)).tokenizer
    basic = {"basic": conversations["basic"]}
    assert check_templates_against_cli(chat_model_dir, tokenizer, basic, {}, tmp_path) >= 8
