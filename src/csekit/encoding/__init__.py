"""The encoder (backbone + tokenizer + pooler, saved as a sentence-transformers folder) and the poolers."""
