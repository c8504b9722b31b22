"""microllm.train(): one call that trains (microllm.Trainer underneath)."""
from ._microllm import Trainer


def train(config=None, data=None, *, on_log=None, on_eval=None, on_step=None, on_checkpoint=None, **overrides):
    """Trains a model as `microllm train` does and returns {steps, stopped, checkpoint_dir, seconds, last_eval}.

    config: a dict, a JSON file's path or JSON text with the fields of train::TrainConfig (model, batch_size,
    seq_len, steps, lr, device, out_dir, ...); data: a token-file prefix from `microllm prepare`; keyword
    arguments override config fields. Callbacks: on_log(metrics dict: step, loss, lr, grad_norm,
    tokens_per_second, ...), on_eval(dict), on_step(step), on_checkpoint(dir); one returning False stops the run
    after the step, saving a checkpoint (result["stopped"]). Ctrl-C stops it the same way, then raises
    KeyboardInterrupt.

        microllm.train({"model": "tiny", "steps": 200}, data="data/tokens/austen", out_dir="runs/a",
                       on_log=lambda m: print(m["step"], m["loss"]))
    """
    if data is not None:
        overrides["data"] = str(data)
    trainer = Trainer(config, **overrides)
    return trainer.run(on_log=on_log, on_eval=on_eval, on_step=on_step, on_checkpoint=on_checkpoint)
