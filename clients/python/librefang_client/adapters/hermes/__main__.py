"""`python -m librefang_client.adapters.hermes install [HERMES_HOME]`: writes the plugin directory."""

import sys

from librefang_client.adapters.hermes.plugin import install

USAGE = "usage: python -m librefang_client.adapters.hermes install [HERMES_HOME]"

if len(sys.argv) not in (2, 3) or sys.argv[1] != "install":
    sys.exit(USAGE)
path = install(sys.argv[2] if len(sys.argv) == 3 else None)
print(f"installed {path}\nin config.yaml: memory.provider: librefang; plugins.enabled: [librefang]; "
      "context.engine: librefang (LIBREFANG_URL and LIBREFANG_TOKEN in the environment or .env)")
