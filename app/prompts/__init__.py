"""From a request to prompt tokens: the chat template (``rendering``), tool definitions in the prompt
(``tools``) and the cached chunked tokenization (``chunked_tokens``)."""
