"""Plugins on disk: plugin.toml and its checks, the catalog of installed plugins, install/update/uninstall and where
a plugin comes from, per-plugin virtualenvs, lint, doctor and the scaffold. Nothing here runs a hook.

Its modules, one line each: docs/architecture.md, "Module map".
"""
