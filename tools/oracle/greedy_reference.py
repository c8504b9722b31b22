"""transformers' logits and greedy continuation as the oracles compare them: a full forward per token (no KV
cache, no stop tokens), with the smallest top-1 minus top-2 logit gap on the path, so that a token flipped
by a near-tie can be told from a bug. Shared by model_golden.py and parity_full.py."""
import torch


@torch.no_grad()
def logits_of(model, ids):
    return model(input_ids=ids, use_cache=False).logits.float()


@torch.no_grad()
def greedy(model, prompt, steps):
    """Argmax continuation of prompt ([P] or [1, P]); returns (tokens [steps] int64, min top-2 gap)."""
    ids = prompt.reshape(1, -1)
    tokens, margin = [], float("inf")
    for _ in range(steps):
        last = logits_of(model, ids)[0, -1]
        top = torch.topk(last, 2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        token = int(top.indices[0])
        tokens.append(token)
        ids = torch.cat([ids, torch.tensor([[token]], dtype=ids.dtype, device=ids.device)], dim=1)
    return torch.tensor(tokens, dtype=torch.int64), margin
