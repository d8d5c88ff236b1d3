#!/usr/bin/env python3
"""megakernel-agent's command line, run from a checkout (`python run_agent.py --help`); installed, the
console script `megakernel-agent` runs the same main (megakernel_agent.agent.cli)."""

import sys

from megakernel_agent.agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
