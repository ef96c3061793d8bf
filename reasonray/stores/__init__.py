"""Where records are kept: one module per kind, its interface and its file/SQLite and PostgreSQL implementations."""
