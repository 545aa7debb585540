"""Infrastructure every layer may use (layer 0).

Errors (`errors`); files: writes in folders csekit owns (`atomic`), reads of files from elsewhere
(`bounded_read`, `json_lines`, `lines`), names from files joined to folders (`safe_names`), a failed
save as one line (`save_guard`), one writer per result (`run_lock`), JSON that every reader accepts
(`json_text`); the compute precision (`precision`), progress output (`progress`), gathering embeddings
across processes (`distributed`), the generic `Registry` (`registry`) and the version (`version`).

Nothing here imports from another csekit package, not even for type checking
(`tests/invariants/architecture/test_architecture.py`).
Each kind's registry is made in the kind's own package, beside its built-in table, which it hands to
`Registry` as a mapping.
"""
