"""`python -m agenthost.host.cli`: the agenthost command, as the console script runs it."""

from agenthost.host.cli.main import main

raise SystemExit(main())
