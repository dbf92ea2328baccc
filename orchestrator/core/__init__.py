"""The words every package shares (errors, exit codes, states, job spec, protocol, settings); imports no gpuq package.

Also redaction and the host agent's stdlib modules that the controller loads by path.
"""
