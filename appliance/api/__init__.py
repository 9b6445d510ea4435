"""The HTTP side: OpenAI wire formats, tokenization, chat templates. Litestar on uvicorn."""

from appliance.api.app import create_app

__all__ = ["create_app"]
