"""OpenAI API schemas, per endpoint group. No engine or torch imports here."""
