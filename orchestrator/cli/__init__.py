"""The gpuq command line: click only; each command parses, calls one api function, renders."""
