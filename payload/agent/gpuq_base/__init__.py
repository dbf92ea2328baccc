"""The agent's base (contract copy, files, processes, host facts, secrets, argv, gang): imports the stdlib only."""
