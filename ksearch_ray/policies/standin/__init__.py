"""An LLM stand-in: an OpenAI-compatible server on loopback that reads ksearch prompts and answers them."""
