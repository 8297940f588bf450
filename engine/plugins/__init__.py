"""Plugins on disk: plugin.toml and its checks, the catalog of installed plugins, install/update/uninstall and where
a plugin comes from, per-plugin virtualenvs, lint, doctor and the scaffold. Nothing here runs a hook.

    manifest.py            plugin.toml: the model, parsing, semantic findings
    loader.py              a plugin directory read and checked ([integrity], hook paths); read_manifest
    catalog.py             the installed plugins, parsed once per change, last good configuration kept
    sources.py             where a plugin comes from (path, git, registry), copied safely; InstallError
    install.py             install, update, uninstall, dependencies, export; the lockfile
    registry.py            registry indexes and their signatures
    bundles.py             content-addressed plugin bundles shared between hosts
    requirements.py        a plugin's own virtualenv
    lint.py, doctor.py     findings about a plugin; runtimes probed
    scaffold.py            new plugins (scaffold_templates.py: text runtimes, their templates in scaffold_scripted.py
                           and scaffold_systems.py; scaffold_wasm.py: wasm)
"""
