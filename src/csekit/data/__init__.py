"""Training corpora (text or JSON lines, streamed) and the data folder with SentEval's files."""
