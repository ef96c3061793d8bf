"""The memory schema, the Chroma store and the ReasoningBank: storage, composite retrieval,
genealogy, workspaces, error-context queries, statistics."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from reasonray.kernel.config import MemorySettings, ScoreWeights
from reasonray.kernel.errors import InvalidParamsError, NotFoundError
from reasonray.memory.bank import ReasoningBank
from reasonray.memory.items import (
    ErrorContext,
    MemoryEntry,
    MemoryItem,
    format_memory_block,
)
from reasonray.memory.scoring import composite, recency, similarity_from_cosine_distance
from reasonray.memory.service import BankService
from reasonray.memory.store import ChromaStore, StoreError, open_client
from tests.docs_examples import REPO
from tests.unit.memory_harness import FixedClock, HashEmbedder, make_bank

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ERROR = ErrorContext(
    error_type="premature rounding", failure_pattern="rounded an intermediate value", corrective_guidance="keep values exact"
)


def item(title: str = "Work step by step", **fields) -> MemoryItem:
    return MemoryItem(title=title, description="Break the problem into steps.", content="Compute each step exactly.", **fields)


# -- the schema -----------------------------------------------------------------------------------
def test_memory_item_has_uuid_and_timezone_aware_time_and_round_trips_through_json():
    a = item(pattern_tags=["arithmetic"], difficulty_level="easy", domain_category="math", error_context=ERROR)
    assert isinstance(a.id, uuid.UUID) and a.created_at.tzinfo is not None
    back = MemoryItem.model_validate_json(a.model_dump_json())
    assert back == a
    assert json.loads(a.model_dump_json())["error_context"]["error_type"] == "premature rounding"


@pytest.mark.parametrize("missing", ["title", "description", "content"])
def test_items_missing_a_required_field_are_rejected(missing):
    fields = {"title": "t", "description": "d", "content": "c"}
    del fields[missing]
    with pytest.raises(ValidationError, match=missing):
        MemoryItem(**fields)
    with pytest.raises(ValidationError):
        MemoryItem(**{**{"title": "t", "description": "d", "content": "c"}, missing: "   "})


def test_naive_timestamps_and_unknown_fields_are_rejected():
    with pytest.raises(ValidationError):
        item(created_at=datetime(2026, 1, 1))
    with pytest.raises(ValidationError):
        MemoryItem(title="t", description="d", content="c", colour="red")


def test_format_for_prompt_flags_failures_as_warnings():
    plain, warning = item(), item("Keep values exact", error_context=ERROR)
    assert "WARNING" not in plain.format_for_prompt()
    text = warning.format_for_prompt()
    assert text.startswith("### [WARNING: past failure] Keep values exact")
    assert "premature rounding" in text and "keep values exact" in text
    block = format_memory_block([plain, warning])
    assert "decide whether it applies" in block and format_memory_block([]) == ""


# -- scoring --------------------------------------------------------------------------------------
def test_similarity_is_cosine_and_recency_halves_at_the_half_life():
    assert similarity_from_cosine_distance(0.0) == 1.0
    assert similarity_from_cosine_distance(1.0) == 0.0  # orthogonal
    assert similarity_from_cosine_distance(1.6) == 0.0  # opposite directions are clamped, not negative
    assert recency(NOW, NOW, 30) == 1.0
    assert recency(NOW - timedelta(days=30), NOW, 30) == pytest.approx(0.5)
    assert recency(NOW - timedelta(days=60), NOW, 30) == pytest.approx(0.25)


def test_composite_weights_each_component_and_stays_in_range():
    old_warning = item(error_context=ERROR, domain_category="math", created_at=NOW - timedelta(days=30))
    s = composite(
        old_warning, 0.6, now=NOW, weights=ScoreWeights(similarity=0.5, recency=0.25, error_context=0.25), half_life_days=30, domain="math"
    )
    assert (s.similarity, s.recency, s.error_context) == (0.6, 0.5, 1.0)
    assert s.composite == pytest.approx(0.5 * 0.6 + 0.25 * 0.5 + 0.25 * 1.0)
    only_similarity = composite(
        old_warning, 0.6, now=NOW, weights=ScoreWeights(similarity=1, recency=0, error_context=0), half_life_days=30
    )
    assert only_similarity.composite == pytest.approx(0.6)
    other_domain = composite(old_warning, 0.6, now=NOW, weights=ScoreWeights(), half_life_days=30, domain="coding")
    assert other_domain.error_context == 0.6  # no domain match: the similarity of the failure is its relevance
    pattern = composite(old_warning, 0.1, now=NOW, weights=ScoreWeights(), half_life_days=30, error_patterns=["premature rounding"])
    assert pattern.error_context == 1.0
    assert composite(item(), 0.9, now=NOW, weights=ScoreWeights(), half_life_days=30).error_context == 0.0
    with pytest.raises(ValidationError):
        ScoreWeights(similarity=0, recency=0, error_context=0)


# -- storage and retrieval ------------------------------------------------------------------------
def entry(task_id: str, query: str, *items: MemoryItem, outcome="success") -> MemoryEntry:
    return MemoryEntry(
        task_id=task_id, query=query, trajectory=f"reasoning about {query}", outcome=outcome, judged_by="verifier", items=list(items)
    )


def test_a_stored_entry_is_retrieved_for_a_similar_task_with_its_items_and_trace(tmp_path):
    bank = make_bank(tmp_path)
    stored, _ = bank.store_entry(
        entry("t1", "how many apples does the farmer sell in a week", item("Multiply rate by time"), item("Check units")), workspace="w"
    )
    bank.store_entry(entry("t2", "translate this sentence into french please", item("Keep the tone")), workspace="w")
    found = bank.retrieve("how many apples does the farmer sell in a month", workspace="w")
    assert {r.memory.title for r in found} == {"Multiply rate by time", "Check units"}  # top 1 task: both its items
    assert all(r.memory.task_id == "t1" for r in found)
    assert found[0].scores.similarity > 0.5 and 0 <= found[0].scores.composite <= 1
    trace = bank.store.traces("w", "t1")[0]
    assert trace["outcome"] == "success" and trace["item_ids"] == [str(i.id) for i in stored]
    assert "farmer" in trace["trajectory"]
    assert len(bank.retrieve("how many apples does the farmer sell", workspace="w", top_k=2, min_similarity=0)) == 3


def test_the_current_task_never_retrieves_its_own_memories(tmp_path):
    bank = make_bank(tmp_path)
    bank.store_entry(entry("task-a", "add the two numbers 3 and 4", item("Add carefully")), workspace="w")
    assert bank.retrieve("add the two numbers 3 and 4", workspace="w")
    assert bank.retrieve("add the two numbers 3 and 4", workspace="w", exclude_task_ids=["task-a"]) == []


def test_dissimilar_memories_fall_below_the_similarity_floor(tmp_path):
    bank = make_bank(tmp_path, min_similarity=0.3)
    bank.store_entry(entry("t", "bake a chocolate cake for twelve people", item("Scale the recipe")), workspace="w")
    assert bank.retrieve("prove that the square root of two is irrational", workspace="w") == []


def test_lessons_from_failures_in_the_task_domain_rank_first_and_are_flagged(tmp_path):
    bank = make_bank(tmp_path, weights=ScoreWeights(similarity=0.5, recency=0.0, error_context=0.5))
    query = "compute the total cost of the order with tax"
    bank.store_entry(entry("ok", query, item("Sum the line items", domain_category="math")), workspace="w")
    bank.store_entry(
        entry("bad", query, item("Do not round the tax", error_context=ERROR, domain_category="math"), outcome="failure"), workspace="w"
    )
    found = bank.retrieve(query, workspace="w", top_k=2, domain="math")
    assert [r.memory.title for r in found] == ["Do not round the tax", "Sum the line items"]
    assert found[0].warning and not found[1].warning
    assert [m.title for m in bank.errors(workspace="w")] == ["Do not round the tax"]
    assert bank.errors(workspace="w", error_type="premature rounding", domain="math")
    assert bank.errors(workspace="w", error_type="off by one") == []
    assert [r.memory.title for r in bank.retrieve(query, workspace="w", top_k=5, error_only=True)] == ["Do not round the tax"]


def test_recency_prefers_newer_memories_of_equal_similarity(tmp_path):
    clock = FixedClock(NOW)
    bank = make_bank(tmp_path, clock=clock, weights=ScoreWeights(similarity=0.5, recency=0.5, error_context=0.0))
    query = "schedule the meetings for the team"
    bank.store_items([item("Old advice", created_at=NOW - timedelta(days=90))], workspace="w", keys=[query])
    bank.store_items([item("New advice", created_at=NOW - timedelta(days=1))], workspace="w", keys=[query])
    found = bank.retrieve(query, workspace="w", top_k=2)
    assert [r.memory.title for r in found] == ["New advice", "Old advice"]
    assert found[1].scores.recency == pytest.approx(0.125)


def test_memories_persist_when_the_store_is_reopened(tmp_path):
    first = make_bank(tmp_path)
    first.store_entry(entry("t", "count the vowels in a word", item("Iterate over characters")), workspace="w")
    del first
    # Another process reads the directory: Chroma keeps clients per path in its own process, so a
    # reopen in this one could be answered from memory without touching the disk.
    script = (
        "from pathlib import Path; from tests.unit.memory_harness import make_bank; "
        f"bank = make_bank(Path({str(tmp_path)!r})); "
        "print([r.memory.title for r in bank.retrieve('count the vowels in a word', workspace='w')])"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "['Iterate over characters']"


def test_a_workspace_filled_by_another_embedding_model_is_refused(tmp_path):
    make_bank(tmp_path).store_items([item()], workspace="w")
    other = HashEmbedder()
    other.name = "another-model"
    with pytest.raises(StoreError, match="another-model"):
        make_bank(tmp_path, embedder=other).retrieve("anything", workspace="w")


def test_a_failed_trace_write_leaves_no_items_behind(tmp_path, monkeypatch):
    bank = make_bank(tmp_path)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(bank.store, "add_trace", broken)
    with pytest.raises(OSError):
        bank.store_entry(entry("t", "count the vowels", item()), workspace="w")
    assert bank.store.count("w") == (0, 0)


def test_writes_are_idempotent_by_id(tmp_path):
    bank = make_bank(tmp_path)
    a = item()
    bank.store_items([a], workspace="w")
    bank.store_items([a], workspace="w")  # a retried write (the actor re-runs calls after a restart)
    assert bank.store.count("w") == (1, 0)


# -- genealogy ------------------------------------------------------------------------------------
def test_genealogy_records_parents_stages_ancestry_and_every_descendant(tmp_path):
    bank = make_bank(tmp_path)
    root = item("Root")
    [root] = bank.store_items([root], workspace="w")
    child = item("Child", parent_memory_id=root.id, evolution_stage=7)  # the bank sets the stage
    sibling = item("Sibling", parent_memory_id=root.id)
    grandchild = item("Grandchild", parent_memory_id=child.id)
    stored = bank.store_items([child, sibling, grandchild], workspace="w")  # a parent may be in the same write
    assert [s.evolution_stage for s in stored] == [1, 1, 2]
    tree = bank.genealogy(str(grandchild.id), workspace="w")
    assert [a["title"] for a in tree["ancestors"]] == ["Root", "Child"] and tree["evolution_stage"] == 2
    top = bank.genealogy(str(root.id), workspace="w")
    assert sorted(c["memory"]["title"] for c in top["descendants"]) == ["Child", "Sibling"]
    assert top["descendant_count"] == 3
    assert {d.title for d in bank.descendants(str(root.id), workspace="w")} == {"Child", "Sibling", "Grandchild"}
    found = bank.retrieve("Grandchild. Break the problem into steps. Compute each step exactly.", workspace="w", top_k=5)
    by_title = {r.memory.title: r.genealogy for r in found}
    assert by_title["Grandchild"] == {"parent_memory_id": str(child.id), "evolution_stage": 2}


def test_a_parent_must_exist_in_the_same_workspace(tmp_path):
    bank = make_bank(tmp_path)
    [elsewhere] = bank.store_items([item("Elsewhere")], workspace="other")
    with pytest.raises(InvalidParamsError, match="not a memory of workspace 'w'"):
        bank.store_items([item("Orphan", parent_memory_id=elsewhere.id)], workspace="w")
    assert bank.store.count("w") == (0, 0)
    with pytest.raises(NotFoundError):
        bank.get(str(uuid.uuid4()), workspace="w")
    with pytest.raises(InvalidParamsError, match="not a UUID"):
        bank.get("not-a-uuid", workspace="w")


# -- workspaces -----------------------------------------------------------------------------------
def test_workspaces_are_isolated_listed_and_deleted_whole(tmp_path):
    bank = make_bank(tmp_path)
    query = "sort the list of numbers in ascending order"
    bank.store_entry(entry("a", query, item("Team A trick")), workspace="team-a")
    bank.store_entry(entry("b", query, item("Team B trick")), workspace="team-b")
    assert [r.memory.title for r in bank.retrieve(query, workspace="team-a", top_k=5)] == ["Team A trick"]
    assert [r.memory.title for r in bank.retrieve(query, workspace="team-b", top_k=5)] == ["Team B trick"]
    [b_item] = [r.memory for r in bank.retrieve(query, workspace="team-b")]
    with pytest.raises(NotFoundError):
        bank.get(str(b_item.id), workspace="team-a")
    assert b_item.workspace == "team-b"
    assert {w["workspace"]: w["memories"] for w in bank.list_workspaces()} == {"team-a": 1, "team-b": 1}
    assert bank.delete_workspace("team-b") == {"workspace": "team-b", "deleted_memories": 1, "deleted_traces": 1}
    assert bank.retrieve(query, workspace="team-b") == []
    assert [w["workspace"] for w in bank.list_workspaces()] == ["team-a"]
    with pytest.raises(NotFoundError):
        bank.delete_workspace("team-b")


# -- statistics -----------------------------------------------------------------------------------
def test_statistics_count_traces_runs_cache_hits_and_latencies_and_reset(tmp_path):
    bank = make_bank(tmp_path)
    bank.store_entry(entry("s", "task one", item()), workspace="w")
    bank.store_entry(entry("f", "task two", item("Lesson", error_context=ERROR), outcome="failure"), workspace="w")
    bank.retrieve("task one", workspace="w")
    BankService(bank).record_runs({"calls": 4, "cache_hits": 1, "prompt_tokens": 10, "completion_tokens": 5}, runs=1, errors=0)
    s = bank.stats.snapshot()
    assert s["traces"] == {"total": 2, "success": 1, "failure": 1, "success_rate": 0.5, "failure_rate": 0.5}
    assert s["llm"]["cache_hit_rate"] == 0.25 and s["llm"]["api_calls"] == 3
    assert s["retrieval"]["count"] == 1 and s["retrieval"]["p50_ms"] > 0
    assert s["embedding"]["count"] == 3 and s["embedding"]["texts"] == 3
    bank.stats.reset()
    s = bank.stats.snapshot()
    assert s["traces"]["total"] == 0 and s["retrieval"]["count"] == 0 and s["llm"]["cache_hit_rate"] is None
    assert bank.store.count("w") == (2, 2)  # resetting statistics keeps the memories


def test_the_http_client_needs_an_http_url(tmp_path):
    with pytest.raises(StoreError, match="not an http"):
        open_client("ftp://somewhere", tmp_path)
    with pytest.raises(StoreError, match="not reachable"):
        open_client("http://127.0.0.1:9", tmp_path)


def test_banks_share_nothing_across_prefixes(tmp_path):
    client = open_client(None, tmp_path)
    one = ReasoningBank(ChromaStore(client, "test-hash", "one"), HashEmbedder(), MemorySettings())
    two = ReasoningBank(ChromaStore(client, "test-hash", "two"), HashEmbedder(), MemorySettings())
    one.store_items([item()], workspace="w")
    assert two.list_workspaces() == []
