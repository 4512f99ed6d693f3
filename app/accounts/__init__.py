"""Who is calling and what they used: API keys, rate limits, usage records."""
