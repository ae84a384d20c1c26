"""The OpenAI-compatible HTTP API ([openai] listen): /v1/models, /v1/completions and
/v1/chat/completions over the data plane, served by Starlette on uvicorn on the daemon's
own event loop. Needs the `openai-api` extra."""
