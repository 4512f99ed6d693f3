"""A request that leaves a sampling field out gets the model's recommended value (its
generation_config.json), under the deployment's own defaults; ``generation_config=none`` gives OpenAI's."""

from __future__ import annotations

from pathlib import Path

from app.api.serving import sampling_defaults
from app.model_card import ModelCard
from app.model_card import sampling_defaults as from_generation_config
from core.settings import FrontendSettings


def test_the_generation_config_recommends() -> None:
    assert from_generation_config({"temperature": 0.2, "top_p": 0.9, "eos_token_id": 2}) == {"temperature": 0.2,
                                                                                            "top_p": 0.9}
    assert from_generation_config({"temperature": "hot", "top_p": True, "do_sample": False}) == {}


def test_the_served_model_recommends_a_low_temperature(tokenizer_dir: Path) -> None:
    card = ModelCard.load("smollm2", tokenizer_dir)
    assert card.sampling_defaults == {"temperature": 0.2, "top_p": 0.9}
    assert sampling_defaults(card, FrontendSettings()) == {"temperature": 0.2, "top_p": 0.9}
    assert sampling_defaults(card, FrontendSettings(generation_config="none")) == {}
    assert sampling_defaults(card, FrontendSettings(sampling_defaults={"temperature": 0.7})) == {
        "temperature": 0.7, "top_p": 0.9}
