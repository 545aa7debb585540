"""Infrastructure every layer may use: errors, atomic files, locks, precision, processes and the registry.

Nothing here imports from another csekit package (the registry names the built-in tables as strings).
"""
