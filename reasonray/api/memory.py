"""The memory methods of the JSON-RPC API (`MEMORY`), and the ReasoningBank MCP tool names as aliases.

`memory.*` reach the memory bank through the context's `MemoryClient` (the actor behind Serve, the bank
itself in-process). `solve_coding_task`, `retrieve_memories` and `get_memory_genealogy` (and
`get_statistics`, in stats.py) keep the parameters of the ReasoningBank's MCP tools, so MCP clients and
JSON-RPC callers send the same thing.
"""

from __future__ import annotations

import re
import uuid
from typing import Literal

from pydantic import AwareDatetime, Field

from reasonray.api import results
from reasonray.api.context import Context, NoParams
from reasonray.api.declarations import EVERYONE, REASONERS, Access, Resource
from reasonray.api.jsonrpc import Call, Params, Table, declare
from reasonray.api.service import ExecuteParams
from reasonray.kernel.errors import InvalidParamsError
from reasonray.kernel.sandbox import run_python
from reasonray.memory.items import WORKSPACE, Difficulty, ErrorContext
from reasonray.memory.loop import MemoryParams, MemoryReport

MEMORY: Table = {}
CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


class WorkspaceParam(Params):
    workspace: str | None = Field(None, pattern=WORKSPACE, description="The workspace; default: the server's default workspace.")


class RetrieveParams(WorkspaceParam):
    query: str = Field(min_length=1, max_length=20_000, description="The task to find memories for.")
    top_k: int | None = Field(None, ge=1, le=20, description="Past tasks whose memories are returned (default: server's top_k).")
    domain: str | None = Field(None, max_length=100, description="The task's domain: matching lessons from failures rank higher.")
    error_patterns: list[str] = Field(default_factory=list, max_length=20, description="Error types or tags to boost.")
    error_only: bool = Field(False, description="Only memories with error context (lessons from failures).")
    exclude_task_ids: list[str] = Field(default_factory=list, max_length=1000, description="Never return memories of these tasks.")
    min_similarity: float | None = Field(None, ge=0, le=1, description="Similarity floor (default: server's).")


class MemoryItemInput(Params):
    """A memory item to store; `workspace` and `evolution_stage` are the bank's to set."""

    id: uuid.UUID | None = Field(None, description="Omit to get a new UUID.")
    title: str = Field(min_length=1, max_length=200)
    description: str = Field(min_length=1, max_length=500)
    content: str = Field(min_length=1, max_length=4000)
    error_context: ErrorContext | None = None
    parent_memory_id: uuid.UUID | None = Field(None, description="The memory (same workspace) this one evolved from.")
    pattern_tags: list[str] = Field(default_factory=list, max_length=20)
    difficulty_level: Difficulty | None = None
    domain_category: str | None = Field(None, max_length=100)
    source_type: Literal["manual", "passive", "success", "failure", "contrast"] = "manual"
    task_id: str | None = Field(None, max_length=200)
    created_at: AwareDatetime | None = Field(None, description="Omit for now; set it to import older memories.")


class StoreParams(WorkspaceParam):
    items: list[MemoryItemInput] = Field(min_length=1, max_length=100, description="Items to store, all or none.")
    key: str | None = Field(None, max_length=20_000, description="The task the items are found by; default: each item's own text.")


class MemoryIdParams(WorkspaceParam):
    memory_id: str = Field(min_length=1, max_length=64, description="The memory's UUID.")


class ErrorsParams(WorkspaceParam):
    error_type: str | None = Field(None, max_length=200, description="Only this error type.")
    domain: str | None = Field(None, max_length=100, description="Only this domain.")
    limit: int = Field(100, ge=1, le=1000)


class TracesParams(WorkspaceParam):
    task_id: str = Field(min_length=1, max_length=200)


class DeleteWorkspaceParams(Params):
    workspace: str = Field(pattern=WORKSPACE, description="The workspace to delete, with all its memories and traces.")
    confirm: bool = Field(False, description="Must be true: the deletion cannot be undone.")


class SolveCodingTaskParams(Params):
    """The ReasoningBank MCP server's `solve_coding_task` tool, with its parameters."""

    task: str = Field(min_length=1, description="The coding task (at most `[limits] max_query_chars` characters).")
    use_memory: bool = Field(True, description="Retrieve memories into the prompts.")
    enable_matts: bool = Field(True, description="Several attempts, best selected (MaTTS); false: one attempt.")
    matts_k: int = Field(3, ge=1, le=5, description="MaTTS attempts.")
    matts_mode: Literal["parallel", "sequential"] = Field("parallel", description="MaTTS mode.")
    store_result: bool = Field(True, description="Judge the run and store what it teaches.")
    tests: str | None = Field(None, max_length=200_000, description="Python test code run against the solution: the verifier.")
    workspace: str | None = Field(None, pattern=WORKSPACE)
    task_id: str | None = Field(None, min_length=1, max_length=200)


class RetrieveMemoriesParams(Params):
    """The ReasoningBank MCP server's `retrieve_memories` tool, with its parameters."""

    query: str = Field(min_length=1, max_length=20_000)
    n_results: int = Field(1, ge=1, le=20, description="Past tasks whose memories are returned.")
    workspace: str | None = Field(None, pattern=WORKSPACE)
    include_errors: bool = Field(True, description="false: leave out lessons from failures.")
    domain: str | None = Field(None, max_length=100)


class GenealogyAliasParams(Params):
    memory_id: str = Field(min_length=1, max_length=64)
    workspace: str | None = Field(None, pattern=WORKSPACE)


def extract_code(answer: str) -> str:
    """The Python in an answer: its first fenced block, or the answer itself."""
    found = CODE_BLOCK.search(answer)
    return (found.group(1) if found else answer).strip()


READ_WORKSPACE = Access(EVERYONE, (Resource("workspace", "workspace", personal=True),))


@declare(MEMORY, "memory.retrieve", access=READ_WORKSPACE)
async def retrieve(ctx: Context, params: RetrieveParams, call: Call) -> results.RetrieveResult:
    """Memories for a task, ranked by composite score (similarity, recency, error context)."""
    options = params.model_dump(exclude={"query", "workspace"})
    found = await ctx.memory.retrieve(params.query, ctx.workspace(params.workspace), **options)
    return results.RetrieveResult.of({"workspace": ctx.workspace(params.workspace), "memories": found}, call.trace_id)


@declare(MEMORY, "memory.store", access=Access(REASONERS, (Resource("workspace", "workspace", "claim", personal=True),)))
async def store(ctx: Context, params: StoreParams, call: Call) -> results.StoreResult:
    """Store memory items (validated, parents checked) in one workspace; all or nothing."""
    items = [i.model_dump(mode="json", exclude_none=True) for i in params.items]
    keys = [params.key] * len(items) if params.key else None
    stored = await ctx.memory.store_items(items, ctx.workspace(params.workspace), keys)
    return results.StoreResult.of({"workspace": ctx.workspace(params.workspace), "stored": stored}, call.trace_id)


@declare(MEMORY, "memory.get", access=READ_WORKSPACE)
async def get(ctx: Context, params: MemoryIdParams, call: Call) -> results.MemoryResult:
    """One memory by id."""
    return results.MemoryResult.of(await ctx.memory.get(params.memory_id, ctx.workspace(params.workspace)), call.trace_id)


@declare(MEMORY, "memory.genealogy", access=READ_WORKSPACE)
async def genealogy(ctx: Context, params: MemoryIdParams, call: Call) -> results.GenealogyResult:
    """A memory's ancestors (root first) and the tree of memories derived from it."""
    return results.GenealogyResult.of(await ctx.memory.genealogy(params.memory_id, ctx.workspace(params.workspace)), call.trace_id)


@declare(MEMORY, "memory.descendants", access=READ_WORKSPACE)
async def descendants(ctx: Context, params: MemoryIdParams, call: Call) -> results.DescendantsResult:
    """Every memory derived from this one, at any depth."""
    found = await ctx.memory.descendants(params.memory_id, ctx.workspace(params.workspace))
    return results.DescendantsResult.of({"memory_id": params.memory_id, "descendants": found}, call.trace_id)


@declare(MEMORY, "memory.errors", access=READ_WORKSPACE)
async def errors(ctx: Context, params: ErrorsParams, call: Call) -> results.MemoriesResult:
    """Memories with error context (lessons from failures), optionally of one error type or domain."""
    found = await ctx.memory.errors(ctx.workspace(params.workspace), params.error_type, params.domain, params.limit)
    return results.MemoriesResult.of({"workspace": ctx.workspace(params.workspace), "memories": found}, call.trace_id)


@declare(MEMORY, "memory.traces", access=READ_WORKSPACE)
async def traces(ctx: Context, params: TracesParams, call: Call) -> results.TracesResult:
    """The stored reasoning traces of a task: query, trajectory, outcome and item ids."""
    found = await ctx.memory.traces(params.task_id, ctx.workspace(params.workspace))
    return results.TracesResult.of({"task_id": params.task_id, "traces": found}, call.trace_id)


@declare(MEMORY, "memory.list_workspaces", access=Access(EVERYONE, lists="workspace"))
async def list_workspaces(ctx: Context, params: NoParams, call: Call) -> results.WorkspacesResult:
    """Every workspace with its memory and trace counts."""
    workspaces = await ctx.memory.list_workspaces()
    seen = call.visible  # what the guard says the caller may see (None: all)
    if seen is not None:
        workspaces = [w for w in workspaces if seen.allows(w["workspace"])]
    default = ctx.workspace(None) if seen is None else seen.default
    return results.WorkspacesResult.of({"default_workspace": default, "workspaces": workspaces}, call.trace_id)


@declare(MEMORY, "memory.delete_workspace", access=Access(REASONERS, (Resource("workspace", "workspace", "drop", personal=True),)))
async def delete_workspace(ctx: Context, params: DeleteWorkspaceParams, call: Call) -> results.DeleteWorkspaceResult:
    """Delete a workspace with all its memories and traces (needs confirm: true)."""
    if not params.confirm:
        raise InvalidParamsError(
            f"deleting workspace {params.workspace!r} removes all its memories and cannot be undone; send confirm: true",
            {"workspace": params.workspace},
        )
    return results.DeleteWorkspaceResult.of(await ctx.memory.delete_workspace(params.workspace), call.trace_id)


# -- the ReasoningBank MCP tool names, kept as aliases ---------------------------------------
SOLVE_ACCESS = Access(
    REASONERS,
    (Resource("workspace", "workspace", personal=True, claims=lambda p: bool(p.store_result)),),
    strategy="matts",
    limits="run",
)


@declare(MEMORY, "solve_coding_task", access=SOLVE_ACCESS, mcp_tool="solve_coding_task")
async def solve_coding_task(ctx: Context, params: SolveCodingTaskParams, call: Call) -> results.SolveCodingTaskResult:
    """Solve a coding task with refine (and MaTTS), memory-aware; tests, when given, verify it."""

    async def verify(answer: str) -> bool:  # success: the solution and the tests run together in the sandbox without an error
        return (await run_python(f"{extract_code(answer)}\n\n{params.tests}\n", ctx.sandbox)).ok

    # the run a coding task asks for: refine under MaTTS, memory-aware, in the coding domain
    base = {"base_strategy": "refine", "k": params.matts_k, "mode": params.matts_mode, "enabled": params.enable_matts}
    memory = MemoryParams(
        enabled=params.use_memory, workspace=params.workspace, learn=params.store_result, task_id=params.task_id, domain="coding"
    )
    run = ExecuteParams.checked(query=params.task, strategy="matts", strategy_config=base, memory=memory)
    result = await ctx.service.execute(run, call.trace_id, verifier=verify if params.tests else None)
    report = result.memory or MemoryReport(workspace="", task_id="")  # none: nothing retrieved, judged or stored
    summary = {
        "solution": extract_code(result.answer),
        "answer": result.answer,
        **report.model_dump(include={"outcome", "judged_by", "learn_error"}),
        "memories_used": report.model_dump()["retrieved"],
        "memories_stored": report.stored,
        "matts": {k: result.metrics.strategy_specific.get(k) for k in ("mode", "k", "selected", "scores", "fallback")},
        "metrics": result.metrics.model_dump(),
    }
    return results.SolveCodingTaskResult.of(summary, result.trace_id)


@declare(MEMORY, "retrieve_memories", access=READ_WORKSPACE, mcp_tool="retrieve_memories")
async def retrieve_memories(ctx: Context, params: RetrieveMemoriesParams, call: Call) -> results.RetrieveMemoriesResult:
    """Alias of memory.retrieve with the ReasoningBank tool's parameters (`n_results`, `include_errors`)."""
    found = await ctx.memory.retrieve(params.query, ctx.workspace(params.workspace), top_k=params.n_results, domain=params.domain)
    if not params.include_errors:
        found = [r for r in found if not r["warning"]]
    answer = {"query": params.query, "workspace": ctx.workspace(params.workspace), "memories": found}
    return results.RetrieveMemoriesResult.of(answer, call.trace_id)


@declare(MEMORY, "get_memory_genealogy", access=READ_WORKSPACE, mcp_tool="get_memory_genealogy")
async def get_memory_genealogy(ctx: Context, params: GenealogyAliasParams, call: Call) -> results.GenealogyResult:
    """Alias of memory.genealogy."""
    return results.GenealogyResult.of(await ctx.memory.genealogy(params.memory_id, ctx.workspace(params.workspace)), call.trace_id)
