"""Wires the route modules into one router."""

from fastapi import APIRouter

from app.api import chat, completions, health, keys, lora, models, monitoring, tokenize, usage

api_router = APIRouter()
for module in (health, monitoring, models, chat, completions, tokenize, lora, keys, usage):
    api_router.include_router(module.router)
