"""Model preparation: turn a catalogued GGUF into a Hugging Face directory Sluice can serve."""

from workers.models.catalog import MODELS, UnknownModelError
from workers.models.prepare import prepare_model

__all__ = ["MODELS", "UnknownModelError", "prepare_model"]
