"""A recipe (`recipe.py`) assembled into one model (`model.py`) and trained (`trainer.py`)."""
