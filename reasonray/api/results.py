"""The result models of the JSON-RPC methods: what each method answers, as `rpc.discover` advertises it.

Every method of the table names its result model (its `declare`d return annotation); the OpenRPC
document takes the result schemas from these models, and a unit test runs every method and checks
its real result against the advertised schema, so the two cannot drift. Methods return these models
(a store's record made one by `Result.of`), and the dispatcher serialises them only at the JSON-RPC
boundary; `reasoning.execute` answers its typed `ExecuteResult`. Nested records that
already have a model (memory items, agent cards, run metrics) reuse it. Objects admit members the
model does not list (servers may add some; clients ignore what they do not know); the listed ones
are typed and the required ones always present.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import MISSING, BaseModel, Field, WithJsonSchema

from reasonray.memory.bank import Retrieved
from reasonray.memory.items import MemoryItem
from reasonray.memory.loop import RetrievedSummary
from reasonray.reasoner.session import TurnUsage
from reasonray.strategies.agents import AgentCard
from reasonray.strategies.base import ReasoningMetrics

TRACE_ID_DOC = "The call's trace id, as in the event log, the X-Trace-Id header and errors."


def _absent(value: Any) -> bool:
    """An optional member that is None is left out of the result (`Field(exclude_if=_absent)`), as the record had it."""
    return value is None


class Result(BaseModel):
    """What every method's result carries (rpc.discover's excepted)."""

    trace_id: str = Field(description=TRACE_ID_DOC)

    @classmethod
    def of(cls, record: Mapping[str, Any], trace_id: str) -> Self:
        """The typed result of a store's record, which carries the call's trace id unless it names its own."""
        return cls.model_validate({"trace_id": trace_id, **record})


# -- reasoning -------------------------------------------------------------------------------------
class BoundedIteration(BaseModel):
    iteration: int = Field(description="0-based iteration number.")
    tokens: int = Field(description="Prompt plus completion tokens of the iteration.")
    prompt_tokens: int
    completion_tokens: int
    thinking_tokens: int = Field(description="Of completion_tokens, those the model spent thinking.")
    thinking_finished: bool = Field(description="False when the iteration's reply ended inside its thinking.")
    continued_tokens: int = Field(description="Tokens of thinking the iteration continued from (delethink).")
    carryover_tokens: int | None = Field(None, exclude_if=_absent, description="Tokens carried into the next iteration, when one followed.")
    has_answer: bool = Field(description="True when the iteration produced the final answer.")
    stop: str = Field(description="Why the iteration ended (answer, length, ...).")


class BoundedContextResult(Result):
    """reasoning.bounded_context: the answer, one entry per iteration, the token total and the compute saved."""

    answer: str = Field(description="The final answer, reasoning tags stripped.")
    reasoning: str = Field("", description="The model's thinking behind the answer, as reasoning.execute's `reasoning`.")
    iterations: list[BoundedIteration] = Field(description="One entry per iteration.")
    total_tokens: int = Field(description="Prompt plus completion tokens over every LLM call.")
    compute_savings_pct: float = Field(description="Attention work saved against one long chain of thought, in percent.")
    total_iterations: int
    execution_time_ms: int
    metrics: ReasoningMetrics
    trace: list[dict[str, Any]] | None = Field(description="The run's events, when include_trace was true.")


class StrategyInfo(BaseModel):
    name: str
    description: str
    capabilities: list[str] = Field(description="`reasoning.strategy.<name>` and what else the strategy advertises.")
    config_schema: dict[str, Any] = Field(description="JSON Schema of the strategy's `strategy_config`.")
    system_defaults: dict[str, Any] = Field(description="The server's defaults for this strategy's config.")


class StrategiesResult(Result):
    default_strategy: str = Field(description="The strategy a request naming none runs.")
    strategies: list[StrategyInfo] = Field(description="The enabled strategies.")
    plugin_failures: list[dict[str, Any]] = Field(description="Strategy plugins that failed to load, and why.")


# -- agents ----------------------------------------------------------------------------------------
class AgentResult(AgentCard, Result):
    """agent.get: the card itself."""


class AgentRegisterResult(Result):
    agent: AgentCard = Field(description="The card as registered.")
    replaced: bool = Field(description="True when a card with this id was replaced.")


class AgentListResult(Result):
    agents: list[AgentCard] = Field(description="The cards the caller may read.")


class AgentDiscoverResult(AgentListResult):
    capabilities: list[str] = Field(description="The capabilities asked for.")


class AgentUnregisterResult(Result):
    unregistered: AgentCard = Field(description="The card that was removed.")


# -- sessions --------------------------------------------------------------------------------------
class PendingToolCall(BaseModel):
    tool_call_id: str = Field(description="Answer it in session.resume's tool_results.")
    name: str = Field(description="The client tool to run.")
    # documented as the object they should be; a model that wrote no JSON object is answered with what it wrote
    arguments: Annotated[Any, WithJsonSchema({"type": "object", "additionalProperties": True})] = Field(
        description="Its arguments, as the model wrote them."
    )


class SessionResult(Result):
    session_id: str


class SessionCreateResult(SessionResult):
    status: str = Field(description="`idle` for a new session.")
    mode: str = Field(description="The session's mode.")
    server_tools: list[str] = Field(description="Server tools the session may use.")
    client_tools: list[str] = Field(description="Client tools the model may call (names).")


class TurnResult(SessionResult):
    """session.turn and session.resume."""

    turn: int = Field(description="1-based turn number.")
    status: str = Field(description="`completed` (the answer is set) or `awaiting_client_tools` (pending_tool_calls).")
    answer: str | None = Field(description="The final answer (exit mode 1); null while client tools are pending.")
    pending_tool_calls: list[PendingToolCall] = Field(description="Client tool calls to answer with session.resume (exit mode 2).")
    mode: str
    llm_calls: int = Field(description="LLM calls of this turn so far.")
    trace: list[dict[str, Any]] = Field(description="The turn's events.")
    usage: TurnUsage = Field(description="Tokens of this turn's LLM calls (charged to the caller's budget).")
    memory: dict[str, Any] | None = Field(description="What the turn retrieved or learned, when the session is memory-aware.")


class SessionGetResult(SessionResult):
    status: str
    mode: str
    turn: int = Field(description="Turns so far.")
    created_at: str
    updated_at: str
    pending_tool_calls: list[PendingToolCall]
    messages: int = Field(description="Messages in the session's history.")
    last_answer: str | None
    last_error: dict[str, Any] | str | None = Field(description="The last turn's error, when it failed.")
    trace: list[dict[str, Any]] = Field(description="The last turn's events.")
    server_tools: list[str]
    client_tools: list[str]


class SessionCloseResult(SessionResult):
    status: Literal["closed"]


class SessionToolsResult(Result):
    server_tools: list[dict[str, Any]] = Field(description="OpenAI-style function tools: type, function.name/description/parameters.")


# -- memory ----------------------------------------------------------------------------------------
class WorkspaceResult(Result):
    workspace: str


class RetrieveResult(WorkspaceResult):
    memories: list[Retrieved] = Field(description="Best first, by composite score.")


class RetrieveMemoriesResult(RetrieveResult):
    query: str


class StoreResult(WorkspaceResult):
    stored: list[MemoryItem] = Field(description="The items as stored (ids and stages set).")


class MemoryResult(MemoryItem, Result):
    """memory.get: the item itself."""


class GenealogyNode(BaseModel):
    memory: MemoryItem
    children: list[GenealogyNode]


class GenealogyResult(Result):
    memory: MemoryItem
    evolution_stage: int
    ancestors: list[MemoryItem] = Field(description="Root first.")
    descendants: list[GenealogyNode] = Field(description="The tree of memories derived from this one.")
    descendant_count: int


class DescendantsResult(Result):
    memory_id: str
    descendants: list[MemoryItem]


class MemoriesResult(WorkspaceResult):
    """memory.errors."""

    memories: list[MemoryItem]


class StoredTrace(BaseModel):
    task_id: str
    query: str
    trajectory: str
    outcome: str
    judged_by: str
    item_ids: list[str] = Field(description="The memories learned from this trace.")


class TracesResult(Result):
    task_id: str
    traces: list[StoredTrace]


class WorkspaceInfo(BaseModel):
    workspace: str
    memories: int
    traces: int


class WorkspacesResult(Result):
    default_workspace: str = Field(description="The workspace a call naming none uses (the caller's own with auth on).")
    workspaces: list[WorkspaceInfo] = Field(description="The workspaces the caller may read.")


class DeleteWorkspaceResult(WorkspaceResult):
    deleted_memories: int
    deleted_traces: int


class ShareResult(WorkspaceResult):
    readers: list[str] = Field(description="Who may read it now, sorted.")


class Latency(BaseModel):
    count: int
    mean_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    total_ms: float
    texts: int | None = Field(None, exclude_if=_absent, description="Of the embedding's: the texts embedded.")


class TraceCounts(BaseModel):
    total: int
    success: int
    failure: int
    success_rate: float | None
    failure_rate: float | None


class LlmCounts(BaseModel):
    calls: int
    cache_hits: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    api_calls: int
    cache_hit_rate: float | None


class StatsResult(Result):
    """stats.get, stats.reset (the counters after the reset) and get_statistics."""

    since: str = Field(description="When the counters started (ISO 8601).")
    traces: TraceCounts
    items_stored: int
    passive_learning: dict[str, int]
    runs: dict[str, int] = Field(description="total and errors.")
    llm: LlmCounts
    retrieval: Latency
    embedding: Latency
    embedder: str = Field(description="The embedding model's name.")
    # MISSING: left out when the record has none (a server without a cache), null when it says so (withheld)
    llm_cache: dict[str, Any] | MISSING | None = Field(
        MISSING, description="The shared LLM response cache's counters, when the server has one."
    )
    scope: str = Field(
        "server",
        exclude_if=lambda scope: scope == "server",  # the server's own counters say nothing of a scope
        description="server: every principal's activity (admins, or authentication off); principal: the caller's own "
        "`usage`, the server-wide counters withheld (zero).",
    )
    usage: dict[str, int] | None = Field(
        None,
        exclude_if=_absent,
        description="With scope principal: requests_last_minute, runs_in_flight, tokens_this_minute, tokens_today.",
    )


class MattsSummary(BaseModel):
    mode: str | None
    k: int | None
    selected: int | None
    scores: list[float | None] | None
    fallback: bool | None


class SolveCodingTaskResult(Result):
    solution: str = Field(description="The Python in the answer (its first fenced block, or the answer).")
    answer: str
    outcome: str | None = Field(description="success or failure, when the run was judged.")
    judged_by: str | None
    memories_used: list[RetrievedSummary]
    memories_stored: list[str]
    learn_error: str | None
    matts: MattsSummary
    metrics: ReasoningMetrics


# -- discovery -------------------------------------------------------------------------------------
class OpenRpcDocument(BaseModel):
    """rpc.discover: an OpenRPC 1.x document (https://spec.open-rpc.org), returned verbatim (no trace_id)."""

    openrpc: str
    info: dict[str, Any]
    methods: list[dict[str, Any]]
    components: dict[str, Any]
    servers: list[dict[str, Any]] | None = Field(None, exclude_if=_absent)
