"""The keeper of a user's default testbed: `python -m netbench.testbed.keeper STATE PRIVILEGE`,
started by testbed/sandbox.py's `start_keeper` inside a new sandbox. It holds the sandbox's
namespaces between commands and does nothing else; SIGTERM ends it (and with its last
process, the sandbox)."""

from __future__ import annotations

import sys
from pathlib import Path

from netbench.testbed.sandbox import serve_keeper

if __name__ == "__main__":
    serve_keeper(Path(sys.argv[1]), sys.argv[2])
