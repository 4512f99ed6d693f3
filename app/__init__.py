"""The Sluice frontend: OpenAI-compatible API, tokenization, routing, enqueue, streaming."""
