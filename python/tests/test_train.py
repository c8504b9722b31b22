"""microllm.Trainer / microllm.train against the C++ trainer (`microllm train`): the same losses step by step, callbacks
that stop the run, parameters as tensors; autograd Variables against NumPy."""
import json
import os
import pathlib
import random
import subprocess

import numpy as np
import pytest

import microllm

BIN = os.environ.get("MICROLLM_BIN")
SMALL = {"model": "tiny", "batch_size": 4, "seq_len": 32, "warmup_steps": 1, "eval_interval": 0,
         "eval_batches": 1, "log_interval": 1, "threads": 1}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """A token-file prefix made by `microllm prepare` from seeded random words."""
    if not BIN:
        pytest.skip("MICROLLM_BIN (the microllm command) is not set")
    root = tmp_path_factory.mktemp("train")
    rng = random.Random(7)
    words = "the of and to in a is that for it as was with be by on not he this are or his".split()
    (root / "text.txt").write_text(" ".join(rng.choice(words) for _ in range(20000)))
    subprocess.run([BIN, "prepare", "--input", str(root / "text.txt"), "--output", str(root / "tok"),
                    "--block-tokens", "1024"], check=True, capture_output=True)
    return root / "tok"


def test_losses_equal_the_command_line_trainer(tokens, tmp_path):
    steps = 3
    subprocess.run([BIN, "train", "--preset", "tiny", "--data", str(tokens), "--out", str(tmp_path / "cli"),
                    "--steps", str(steps), "--batch-size", "4", "--seq-len", "32", "--warmup", "1",
                    "--eval-interval", "0", "--threads", "1", "--set", "log_interval=1", "--set", "eval_batches=1"],
                   check=True, capture_output=True)
    cli = [json.loads(line) for line in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()]
    cli_losses = [m["loss"] for m in cli if "lr" in m]
    logged = []
    result = microllm.train(SMALL, data=tokens, steps=steps, out_dir=str(tmp_path / "py"),
                            on_log=lambda m: logged.append(m["loss"]))
    assert result["steps"] == steps and not result["stopped"]
    assert len(logged) == steps == len(cli_losses)
    assert logged == pytest.approx(cli_losses, rel=1e-6), (logged, cli_losses)
    assert pathlib.Path(result["checkpoint_dir"], "model.safetensors").exists()


def test_a_callback_returning_false_stops_the_run(tokens, tmp_path):
    seen = []

    def on_step(step):
        seen.append(step)
        return step < 2  # False after the second step

    result = microllm.train(SMALL, data=tokens, steps=10, out_dir=str(tmp_path), on_step=on_step)
    assert result["stopped"] and result["steps"] == 2 and seen == [1, 2]
    assert pathlib.Path(result["checkpoint_dir"], "trainer_state.json").exists()
    resumed = microllm.Trainer(SMALL, data=str(tokens), steps=10, out_dir=str(tmp_path), resume=True)
    assert resumed.resumed and resumed.steps_done == 2


def test_a_callback_that_raises_stops_the_run_and_raises_again(tokens, tmp_path):
    def on_log(metrics):
        raise RuntimeError(f"stop at {metrics['step']}")

    with pytest.raises(RuntimeError, match="stop at 1"):
        microllm.train(SMALL, data=tokens, steps=5, out_dir=str(tmp_path), on_log=on_log)


def test_parameters_and_config_errors(tokens, tmp_path):
    trainer = microllm.Trainer(SMALL, data=str(tokens), steps=1, out_dir=str(tmp_path))
    params = trainer.parameters()
    embed = np.asarray(params["model.embed_tokens.weight"])
    assert embed.ndim == 2 and embed.shape[0] == 256  # the tiny preset: bytes
    before = embed.copy()
    trainer.step()
    assert trainer.steps_done == 1
    assert not np.array_equal(before, embed), "the array shares the trainer's weights, which a step changes"
    with pytest.raises(microllm.ParseError, match="bacth_size"):
        microllm.Trainer({"bacth_size": 4})


def test_autograd_matmul_and_cross_entropy_gradients_equal_numpy():
    seed = random.randrange(1 << 30)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    wv = microllm.Variable(microllm.from_numpy(w.copy()), requires_grad=True)
    y = microllm.autograd.matmul(microllm.from_numpy(x), wv)
    loss = microllm.autograd.sum(y)
    loss.backward()
    np.testing.assert_allclose(np.asarray(wv.grad), x.T @ np.ones((5, 4), np.float32), rtol=1e-5,
                               err_msg=f"seed {seed}")
    logits = rng.standard_normal((2, 6)).astype(np.float32)
    targets = np.array([1, 4], np.int64)
    lv = microllm.Variable(microllm.from_numpy(logits.copy()), requires_grad=True)
    microllm.autograd.cross_entropy(lv, microllm.from_numpy(targets)).backward()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(2), targets] -= 1
    np.testing.assert_allclose(np.asarray(lv.grad), p / 2, rtol=1e-5, atol=1e-7, err_msg=f"seed {seed}")
    assert microllm.Variable(microllm.from_numpy(x)).grad is None


def test_autograd_attention_and_rope_give_the_ops_values_and_finite_difference_gradients():
    seed = random.randrange(1 << 30)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 4, 5, 8))
    k = rng.standard_normal((1, 2, 5, 8))
    v = rng.standard_normal((1, 2, 5, 8))
    weight = rng.standard_normal((1, 4, 5, 8))
    qv = microllm.Variable(microllm.from_numpy(q.copy()), requires_grad=True)
    out = microllm.autograd.attention(qv, microllm.from_numpy(k), microllm.from_numpy(v), causal=True, scale=0.3)
    expected = microllm.ops.attention(microllm.from_numpy(q), microllm.from_numpy(k), microllm.from_numpy(v),
                                      causal=True, scale=0.3)
    np.testing.assert_allclose(np.asarray(out.value), np.asarray(expected), rtol=1e-12, err_msg=f"seed {seed}")
    out.backward(microllm.from_numpy(weight.copy()))

    def objective(q_values):
        o = microllm.ops.attention(microllm.from_numpy(q_values), microllm.from_numpy(k), microllm.from_numpy(v),
                                   causal=True, scale=0.3)
        return float((np.asarray(o) * weight).sum())

    for index in [(0, 0, 0, 0), (0, 3, 4, 7), (0, 1, 2, 5)]:
        bumped = [q.copy(), q.copy()]
        bumped[0][index] += 1e-6
        bumped[1][index] -= 1e-6
        numeric = (objective(bumped[0]) - objective(bumped[1])) / 2e-6
        assert abs(np.asarray(qv.grad)[index] - numeric) < 1e-6, (index, seed)

    x = rng.standard_normal((1, 3, 2, 8))
    positions = microllm.from_numpy(np.array([4, 5, 6], np.int64))
    xv = microllm.Variable(microllm.from_numpy(x.copy()), requires_grad=True)
    rotated = microllm.autograd.rope(xv, positions, theta=100.0)
    np.testing.assert_allclose(np.asarray(rotated.value),
                               np.asarray(microllm.ops.rope(microllm.from_numpy(x), positions, theta=100.0)), rtol=1e-12)
    rotated.backward(rotated.value)  # a rotation's transpose undoes it: the gradient is x again
    np.testing.assert_allclose(np.asarray(xv.grad), x, rtol=1e-10, atol=1e-12, err_msg=f"seed {seed}")
