"""Loaded as a pytest plugin (-p) before Django reads its settings: every test run gets its own LIBREFANG_HOME,
its own Redis key prefix and its own database file, so runs never touch ~/.librefang or each other."""

import os
import tempfile
import uuid

_root = tempfile.mkdtemp(prefix="librefang-tests-")
os.environ["LIBREFANG_HOME"] = os.path.join(_root, "home")
os.environ["LIBREFANG_REDIS_PREFIX"] = f"lftest-{uuid.uuid4().hex[:8]}"
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-" + uuid.uuid4().hex)
os.environ["LIBREFANG_TEST_ROOT"] = _root
os.makedirs(os.environ["LIBREFANG_HOME"], exist_ok=True)
