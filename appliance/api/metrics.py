"""GET /metrics: Prometheus metrics through prometheus-client, one registry per app.

- `appliance_requests_total{endpoint,status,agent}`: every response, counted as it starts
  (Litestar's `before_send`), errors included;
- histograms: time to first token (from the request's arrival to the first text sent),
  time per output token (after the first) and queue wait (submit to admission, measured on
  the engine thread);
- tokens by agent: prompt, cached (from the prefix cache) and generated;
- at scrape time, from the engine: queue depth, active rows, KV bytes and budget, and per
  prefix-cache tier hits, misses, hit tokens, bytes, entries and evictions.

The agent is the OpenAI `user` field, else the `X-Agent-Id` header, else "anonymous". At most
MAX_AGENTS distinct agents get a label of their own (64 characters at most); later ones
count as "other", so a client cannot grow the metrics without bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator

from litestar import Request, get
from litestar.datastructures import State
from litestar.response import Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from appliance.api.textgen import Done, Piece

MAX_AGENTS = 32
AGENT_HEADER = "x-agent-id"
_T0, _AGENT = "appliance.t0", "appliance.agent"  # keys in the ASGI scope
LATENCY = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120)
PER_TOKEN = (.001, .0025, .005, .01, .02, .04, .08, .15, .3, .6, 1.2)


class Metrics:
    """The app's registry and what writes to it."""

    def __init__(self, engine):
        self.engine = engine
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("appliance_requests", "HTTP responses by endpoint and status",
                                ["endpoint", "status", "agent"], registry=r)
        self.ttft = Histogram("appliance_time_to_first_token_seconds",
                              "From a request's arrival to its first text", ["endpoint"],
                              buckets=LATENCY, registry=r)
        self.tpot = Histogram("appliance_time_per_output_token_seconds",
                              "Mean time per generated token after the first, per request",
                              ["endpoint"], buckets=PER_TOKEN, registry=r)
        self.queue_wait = Histogram("appliance_queue_wait_seconds",
                                    "From submit to admission into a row", buckets=LATENCY,
                                    registry=r)
        self.prompt_tokens = Counter("appliance_prompt_tokens", "Prompt tokens", ["agent"],
                                     registry=r)
        self.cached_tokens = Counter("appliance_cached_prompt_tokens",
                                     "Prompt tokens taken from the prefix cache", ["agent"],
                                     registry=r)
        self.generated_tokens = Counter("appliance_generated_tokens", "Generated tokens",
                                        ["agent"], registry=r)
        r.register(_EngineCollector(engine))
        self._agents: set[str] = set()
        self._lock = threading.Lock()
        engine.on_admitted = self.queue_wait.observe  # called on the engine thread

    def agent(self, name: str | None) -> str:
        """The label for `name`, bounded (see the module docstring)."""
        if not name:
            return "anonymous"
        name = "".join(c for c in name[:64] if c.isprintable())
        with self._lock:
            if name in self._agents:
                return name
            if len(self._agents) < MAX_AGENTS:
                self._agents.add(name)
                return name
        return "other"

    # -- hooks ---------------------------------------------------------------------
    async def before_send(self, message, scope) -> None:
        """Litestar's before_send: stamps the arrival, counts each response as it starts.
        Async, as every hook on the request path: Litestar runs a plain function in a
        worker thread, for every streamed chunk here (a third of the event loop's time
        under a 16-agent load on an H200, and GIL the engine thread waited for)."""
        if message["type"] != "http.response.start" or scope.get("type") != "http":
            return
        endpoint = scope.get("path_template") or "unmatched"
        self.requests.labels(endpoint, str(message["status"]), _agent_of(self, scope)).inc()

    def generation(self, scope, done: Done, first: float | None, last: float) -> None:
        endpoint = scope.get("path_template") or "unmatched"
        agent = _agent_of(self, scope)
        self.prompt_tokens.labels(agent).inc(done.prompt_tokens)
        self.cached_tokens.labels(agent).inc(done.cached_tokens)
        self.generated_tokens.labels(agent).inc(done.completion_tokens)
        t0 = scope.get(_T0)
        if first is not None and t0 is not None:
            self.ttft.labels(endpoint).observe(first - t0)
        if first is not None and done.completion_tokens > 1:
            self.tpot.labels(endpoint).observe((last - first) / (done.completion_tokens - 1))


def _agent_of(metrics: Metrics, scope) -> str:
    if _AGENT not in scope:
        header = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                       if k == AGENT_HEADER.encode()), None)
        scope[_AGENT] = metrics.agent(header)
    return scope[_AGENT]


def arrival(app):
    """Middleware: note when each request arrived (time to first token counts from it)."""
    async def stamped(scope, receive, send):
        scope.setdefault(_T0, time.perf_counter())
        await app(scope, receive, send)

    return stamped


def tag_agent(request: Request, user: str | None) -> None:
    """Label this request's metrics with the body's `user` (OpenAI's field for the end
    user: for an agent fleet, which agent), when it gives one."""
    metrics: Metrics | None = getattr(request.app.state, "metrics", None)
    if user and metrics is not None:
        request.scope[_AGENT] = metrics.agent(user)


async def watch(request: Request, gen: AsyncIterator[Piece | Done]) -> AsyncIterator[Piece | Done]:
    """Pass `generate_text`'s items through, timing the first text and the end."""
    metrics: Metrics | None = getattr(request.app.state, "metrics", None)
    first = None
    try:
        async for item in gen:
            now = time.perf_counter()
            if isinstance(item, Done):
                if metrics is not None and not item.error:
                    metrics.generation(request.scope, item, first, now)
            elif first is None:  # text or a tool call
                first = now
            yield item
    finally:
        await gen.aclose()


class _EngineCollector:
    """The engine's gauges and the prefix cache's counters, read at scrape time."""

    def __init__(self, engine):
        self.engine = engine

    def describe(self):
        return []

    def collect(self):
        stats = self.engine.stats() if self.engine.scheduler is not None else {}
        for name, key, doc in (
                ("appliance_queue_depth", "pending_rows", "Requests waiting for a row"),
                ("appliance_active_rows", "active_rows", "Rows decoding or prefilling"),
                ("appliance_kv_bytes", "kv_bytes", "Bytes of live KV"),
                ("appliance_kv_budget_bytes", "kv_budget_bytes", "The KV budget")):
            if stats.get(key) is not None:
                yield GaugeMetricFamily(name, doc, value=stats[key])
        tiers = stats.get("cache") or {}
        for name, key, doc in (("hits", "hits", "Lookups served"),
                               ("misses", "misses", "Lookups not served"),
                               ("hit_tokens", "hit_tokens", "Prompt tokens served"),
                               ("evictions", "evictions", "Entries evicted")):
            family = CounterMetricFamily(f"appliance_prefix_cache_{name}", f"{doc}, per tier",
                                         labels=["tier"])
            for tier, s in tiers.items():
                family.add_metric([tier], s.get(key, 0))
            yield family
        for name, key, doc in (("bytes", "bytes", "Bytes held"),
                               ("entries", "entries", "Entries held")):
            family = GaugeMetricFamily(f"appliance_prefix_cache_{name}", f"{doc}, per tier",
                                       labels=["tier"])
            for tier, s in tiers.items():
                family.add_metric([tier], s.get(key, 0))
            yield family


# Litestar adds the charset to a text/ type itself: given prometheus_client's, which names
# one already, the header named it twice, which Go's media-type parser (Prometheus) refuses
METRICS_TYPE = CONTENT_TYPE_LATEST.split("; charset=")[0]


@get("/metrics", media_type=METRICS_TYPE, sync_to_thread=False)
def metrics_endpoint(state: State) -> Response:
    """Prometheus text format (see appliance.api.metrics)."""
    return Response(generate_latest(state.metrics.registry), media_type=METRICS_TYPE)
