"""microLLM in Python: tensors shared with NumPy and PyTorch without copies, models, generation and training.

    import microllm
    model = microllm.load_model("models/Qwen2.5-0.5B-Instruct", device="cpu", dtype="f32")

See docs/PYTHON.md.
"""
from ._microllm import *  # noqa: F401,F403
from ._microllm import __version__  # noqa: F401
from .training import train  # noqa: F401,E402
from .llm import LLM, SamplingParams, RequestOutput, CompletionOutput  # noqa: F401,E402
