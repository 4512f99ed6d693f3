"""Wires the route modules into one router."""

from fastapi import APIRouter

from app.api import chat, completions, health, keys, models, monitoring, usage

api_router = APIRouter()
for module in (health, monitoring, models, chat, completions, keys, usage):
    api_router.include_router(module.router)
