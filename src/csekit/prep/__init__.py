"""Data preparation done once before training: word-frequency counts (SLT-FAI), negation and
back-translation augmentation (OssCSE), the match error rate (OssCSE's surface-structure measure)."""
