"""The server's settings: the command line and environment (settings), the config file (file) and
its reload (reload)."""
