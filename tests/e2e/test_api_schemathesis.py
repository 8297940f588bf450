"""Schemathesis against a real service: every operation in /api/openapi.json is fuzzed with an owner token and
must answer without 5xx, with a documented status code, content type and a body matching its schema.

Runs on its own LiveService (own home, database and Redis prefix) because fuzzing creates, reloads and removes
plugins. Bounded by `SCHEMATHESIS_MAX_EXAMPLES` (default 15 per operation, about a minute or two on 2 cores).
"""

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from tests.e2e.live import running_service

# No 5xx and no schema violations. (positive_data_acceptance is left out: several bodies carry constraints a JSON
# schema cannot state, e.g. `url` is required only when `source` is "git", or test-hook `input` depends on `hook`.)
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, checks.response_headers_conformance]
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def fuzz_service(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("fuzz")) as service:
        yield service


def test_it_answers_every_operation_within_its_schema(fuzz_service):
    schema = schemathesis.openapi.from_url(fuzz_service.url + "/api/openapi.json")
    headers = {"Authorization": f"Bearer {fuzz_service.token}"}
    failures, operations = [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def fuzz(case):
            case.call_and_validate(base_url=fuzz_service.url, headers=headers, timeout=60, checks=CHECKS)

        try:
            fuzz()
        except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure, then report them together
            inner = "\n".join(str(e)[:1500] for e in getattr(exc, "exceptions", ()))
            failures.append(f"{operation.label}: {type(exc).__name__}: {str(exc)[:1500]}\n{inner}")
    assert operations >= 30
    assert not failures, "\n\n".join(failures)
