"""Where rows go: the per-device SQLite database (schema, upsert, merge) and exports."""
