"""The engine: token ids in, token ids out. Never imports litestar or hydra."""

from appliance.engine.build import build_engine
from appliance.engine.engine import Engine, RequestHandle
from appliance.engine.types import (
    Finished,
    FinishReason,
    GenerationRequest,
    Rejected,
    SamplingParams,
    Token,
)

__all__ = ["Engine", "Finished", "FinishReason", "GenerationRequest", "Rejected",
           "RequestHandle", "SamplingParams", "Token", "build_engine"]
