"""Model output text to OpenAI fields: ``tool_calls`` (tool_calls.py and one module per format) and
``reasoning_content`` (reasoning.py). Pure text in, typed results out: no I/O, no frontend imports,
so every format is tested as a table and the streaming path is held equal to the whole-text path."""
