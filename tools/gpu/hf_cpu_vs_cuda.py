#!/usr/bin/env python3
"""transformers' own float32 logits of a random-weight model from a config.json, on the CPU and on CUDA: how far
apart the two are says how much of a parity difference on that config is transformers' own device noise.
    python3 tools/gpu/hf_cpu_vs_cuda.py tests/fixtures/configs/gemma-3-270m.json"""
import pathlib
import shutil
import sys
import tempfile

import torch
import transformers

for path in sys.argv[1:]:
    work = pathlib.Path(tempfile.mkdtemp())
    shutil.copy(path, work / "config.json")
    config = transformers.AutoConfig.from_pretrained(str(work))
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    ids = torch.randint(0, config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cpu = model(input_ids=ids).logits.double()
        cuda = model.cuda()(input_ids=ids.cuda()).logits.double().cpu()
    print(f"{pathlib.Path(path).stem}: transformers f32 CPU vs CUDA rel err "
          f"{float((cpu - cuda).norm() / cpu.norm()):.3e}, tf32 allowed: {torch.backends.cuda.matmul.allow_tf32}")
