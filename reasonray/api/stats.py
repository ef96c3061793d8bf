"""The statistics methods: `stats.get`, `stats.reset` and the ReasoningBank MCP tool `get_statistics`,
declared once with their access (`STATS`), served where the application has a memory bank."""

from __future__ import annotations

from reasonray.api.access.limits import own_statistics
from reasonray.api.context import Context, NoParams
from reasonray.api.declarations import EVERYONE, OPERATORS, Access
from reasonray.api.jsonrpc import Call, Table, declare
from reasonray.api.results import StatsResult

STATS: Table = {}
OWN_USAGE = Access(EVERYONE, own_usage=True)


@declare(STATS, "stats.get", access=OWN_USAGE)
async def stats_get(ctx: Context, params: NoParams, call: Call) -> StatsResult:
    """Traces and success rate, LLM calls and cache hit rate, retrieval and embedding latency (a caller who
    may not see every principal's data gets its own usage instead)."""
    stats = await ctx.memory.stats()
    if ctx.cache_stats is not None:
        stats["llm_cache"] = await ctx.cache_stats()
    return StatsResult.of(own_statistics(stats, call.usage) if call.usage is not None else stats, call.trace_id)


@declare(STATS, "stats.reset", access=Access(OPERATORS))
async def stats_reset(ctx: Context, params: NoParams, call: Call) -> StatsResult:
    """Zero the counters (for tests and benchmarks); stored memories are untouched."""
    return StatsResult.of(await ctx.memory.reset_stats(), call.trace_id)


@declare(STATS, "get_statistics", access=OWN_USAGE, mcp_tool="get_statistics")
async def get_statistics(ctx: Context, params: NoParams, call: Call) -> StatsResult:
    """Alias of stats.get."""
    return await stats_get(ctx, params, call)
