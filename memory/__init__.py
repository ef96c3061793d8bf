"""ReasoningBank: the self-evolving reasoning memory (memory items in ChromaDB, retrieval scoring,
extraction, genealogy, workspaces). Pure: never imports Ray; the memory bank actor lives in actors/."""
