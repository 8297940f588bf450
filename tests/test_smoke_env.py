import os

from django.conf import settings


def test_it_uses_a_private_home():
    assert str(settings.LIBREFANG_HOME).startswith(os.environ["LIBREFANG_TEST_ROOT"])
    assert settings.LIBREFANG_REDIS_PREFIX.startswith("lftest-")
