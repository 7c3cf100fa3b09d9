"""tightfit: dense hybrid qwen35 LLMs from GGUF on one small GPU."""
__version__ = "0.1.0"

from tightfit.errors import GGUFError, PlanError, UserError  # noqa: E402,F401


def load(path, **kwargs):
    """Open a qwen35 GGUF. See tightfit.api.load for the arguments."""
    from tightfit.api import load as _load
    return _load(path, **kwargs)
