"""csekit: unsupervised contrastive sentence-embedding learning as composable parts."""

__version__ = "0.1.0"
