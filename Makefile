# Two commands for a new machine: `make run` (set up + serve) and `make test` (set up + test).
PYTHON ?= python3
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint bench setup clean schemathesis lock hermes-lock

# Installs exactly the versions in requirements.lock (hash-checked), then the project itself without resolving again.
# The agent client (clients/python) goes in too: its dependencies (httpx, pydantic) are already the project's.
$(STAMP): pyproject.toml requirements.lock clients/python/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python -m pip install --quiet --no-deps -e clients/python
	touch $(STAMP)

# The cold-hook spawner's spare (and warm hooks' init) as a small static program (engine/process/native_spare.py
# says why); without a C compiler, or if it fails, hooks use the python spare and nothing else changes. Built with
# musl where it is (Debian musl-tools, installed here when we are root): it is spawned for every cold call and every
# warm call's init, and a static glibc's start-up asks the CPU for its caches, ~600 µs in a VM against ~50.
NATIVE_SPARE := engine/process/native/librefang-spare
MUSL_CHECK := $(VENV)/.musl-checked
$(MUSL_CHECK):
	@mkdir -p $(VENV)
	@if ! command -v musl-gcc >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools >/dev/null 2>&1 || \
		echo "could not install musl-tools: the native spare is built with $(CC)"; \
	fi
	@touch $@
$(NATIVE_SPARE): engine/process/native/spare.c $(MUSL_CHECK)
	@if command -v musl-gcc >/dev/null 2>&1 && musl-gcc -O2 -Wall -static -o $@ $< 2>/dev/null; then :; \
	elif command -v $(CC) >/dev/null 2>&1; then \
		$(CC) -O2 -Wall -static -o $@ $< 2>/dev/null || $(CC) -O2 -Wall -o $@ $< || \
		echo "could not build $@: cold hooks use the python spare"; \
	else echo "no C compiler ($(CC)): cold hooks use the python spare"; fi

# The hooks' seccomp filter needs libseccomp (Debian: libseccomp2; engine/process/sandbox_seccomp.py). Installed here
# when we are root; otherwise said, and the service reports sandbox.degraded until it is installed.
SECCOMP_CHECK := $(VENV)/.seccomp-checked
$(SECCOMP_CHECK): $(STAMP)
	@if ! $(BIN)/python -c "import ctypes.util, ctypes; ctypes.CDLL(ctypes.util.find_library('seccomp') or 'libseccomp.so.2')" 2>/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp2 >/dev/null; \
		else echo "libseccomp is missing (apt-get install libseccomp2 as root): hooks run without their seccomp filter (sandbox.degraded)"; fi; \
	fi
	@touch $@

# A service that is not root gives its hooks identities of their own from its user's subordinate ids through
# newuidmap/newgidmap (Debian: uidmap; engine/process/sandbox_userns.py). Installed here when we are root; otherwise
# said, and such a service runs its hooks as its own user (sandbox.degraded) until it is installed.
UIDMAP_CHECK := $(VENV)/.uidmap-checked
$(UIDMAP_CHECK): $(STAMP)
	@if ! command -v newuidmap >/dev/null 2>&1 || ! command -v newgidmap >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq uidmap >/dev/null; \
		else echo "uidmap is missing (apt-get install uidmap as root): a service that is not root runs its hooks as its own user (sandbox.degraded)"; fi; \
	fi
	@touch $@
# Each plugin's data directory is an ext4 image of its own, loop-mounted (engine/process/data_disks.py): mkfs.ext4,
# e2fsck and resize2fs (Debian: e2fsprogs), mount and losetup (Debian: mount). Installed here when we are root;
# otherwise said, and data directories are not size-capped (sandbox.degraded) until they are.
DISKS_CHECK := $(VENV)/.data-disks-checked
$(DISKS_CHECK): $(STAMP)
	@if ! PATH="$$PATH:/usr/sbin:/sbin" command -v mkfs.ext4 >/dev/null 2>&1 || ! PATH="$$PATH:/usr/sbin:/sbin" command -v losetup >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq e2fsprogs mount >/dev/null; \
		else echo "mkfs.ext4 or losetup is missing (apt-get install e2fsprogs mount as root): plugins' data directories are not size-capped (sandbox.degraded)"; fi; \
	fi
	@touch $@

READY := $(STAMP) $(NATIVE_SPARE) $(SECCOMP_CHECK) $(UIDMAP_CHECK) $(DISKS_CHECK)

# Hermes Agent pins exact versions of its dependencies that cannot sit beside requirements.lock, so the test of its
# adapter (tests/e2e/test_client_hermes.py) drives it in a venv of its own: hermes-requirements.lock (hash-checked),
# then the client without its dependencies (Hermes's own httpx and pydantic serve it).
HERMES_VENV := .venv-hermes
HERMES_LOCK := clients/python/hermes-requirements.lock
HERMES_STAMP := $(HERMES_VENV)/.installed-stamp
$(HERMES_STAMP): $(HERMES_LOCK) clients/python/pyproject.toml
	test -x $(HERMES_VENV)/bin/python || $(PYTHON) -m venv $(HERMES_VENV)
	$(HERMES_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(HERMES_VENV)/bin/python -m pip install --quiet --require-hashes -r $(HERMES_LOCK)
	$(HERMES_VENV)/bin/python -m pip install --quiet --no-deps -e clients/python
	touch $(HERMES_STAMP)

setup: $(READY) $(HERMES_STAMP)

run: $(READY)
	$(BIN)/librefang start

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: $(READY) $(HERMES_STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py makemigrations --check --dry-run plugins_app >/dev/null
	$(BIN)/pytest $(PYTEST_ARGS)
	LIBREFANG_WARM_START=0 $(BIN)/pytest -q tests/engine tests/e2e/test_containment.py tests/e2e/test_engine_hostile.py tests/e2e/test_hostile_privilege.py tests/e2e/test_hostile_disk.py  # the engine, containment and hostile hooks again with warm start off (cold spawns)
	LIBREFANG_WARM_START=0 LIBREFANG_NATIVE_SPARE=0 $(BIN)/pytest -q tests/e2e/test_containment.py tests/e2e/test_engine_hostile.py tests/e2e/test_hostile_privilege.py tests/e2e/test_hostile_disk.py  # and below the python spare (a machine without a C compiler)
	@# The memory store (full-text and vector recall, tenant scopes) again on PostgreSQL, when one is reachable (PG_URL to point elsewhere);
	@# a per-run database name so parallel runs never share Django's test database.
	@if $(BIN)/python -c "import psycopg; psycopg.connect('$(PG_URL)', connect_timeout=3).close()" 2>/dev/null; then \
		DATABASE_URL="$(dir $(PG_URL))lfmem_$$$$" $(BIN)/pytest -q tests/app/test_memory.py tests/app/test_recall.py tests/app/test_tenancy.py tests/app/test_engine_llm.py; \
	else echo "PostgreSQL not reachable at $(PG_URL): skipping the PostgreSQL memory-store run"; fi

# A longer schemathesis run than the one `make test` includes (tests/e2e/test_api_schemathesis.py, 15 examples
# per operation): SCHEMATHESIS_MAX_EXAMPLES=N to change it.
schemathesis: $(READY)
	SCHEMATHESIS_MAX_EXAMPLES=$${SCHEMATHESIS_MAX_EXAMPLES:-50} $(BIN)/pytest -q tests/e2e/test_api_schemathesis.py

# Re-resolve requirements.lock from pyproject.toml (the dependencies and the dev extra, with every file's hash).
# Versions already in the lock are kept when still allowed; LOCK_ARGS=--upgrade (or -P name) moves them.
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --quiet --generate-hashes --extra dev --strip-extras --allow-unsafe --no-emit-index-url \
		--no-emit-find-links $(LOCK_ARGS) -o requirements.lock pyproject.toml

# Re-resolve clients/python/hermes-requirements.lock from the client's `hermes` extra (LOCK_ARGS as for `lock`).
hermes-lock: $(STAMP)
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --quiet --generate-hashes --extra hermes --strip-extras --allow-unsafe --no-emit-index-url \
		--no-emit-find-links $(LOCK_ARGS) -o $(HERMES_LOCK) clients/python/pyproject.toml

bench: $(READY)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/recall/run.py

clean:
	rm -rf $(VENV) $(HERMES_VENV) .pytest_cache .ruff_cache *.egg-info $(NATIVE_SPARE)
