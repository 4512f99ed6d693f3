"""What the client reads: detokenized text with stop strings (``text``), chat deltas with reasoning and
tool calls (``chat``, ``parsing/``, ``parser_choice``, ``tool_choice``), log probabilities
(``logprobs``) and structured-output constraints (``structured``)."""
