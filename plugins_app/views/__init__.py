"""Dashboard pages, one module per area (plugins, engine, doctor, tokens, tools)."""
