"""The code that runs inside the sandbox container: the REPL worker and its restricted mode."""
