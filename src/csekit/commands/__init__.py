"""The command line's helpers: typer's command classes and shared options, the checks every command makes on
its options, and the work of the commands too long for csekit.cli (which keeps the commands themselves)."""
