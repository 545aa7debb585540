"""The match error rate (MER) of two sentences: OssCSE's measure of how much their surface structure differs.

It splits the STS probes into Cont. and Oppn. pairs (`csekit.evaluation.probes`) and bounds the
paraphrases the augmenter keeps (`csekit.prep.augment`).
"""

from __future__ import annotations


def mer(reference: str, hypothesis: str) -> float:
    """Match error rate (S+D+I)/(S+D+I+C) on whitespace words, via jiwer; 0 = same words, 1 = nothing shared.

    Two empty sentences are identical (0); one empty sentence shares nothing (1). jiwer refuses empty input.
    """
    import jiwer

    if not reference.split() and not hypothesis.split():
        return 0.0
    if not reference.split() or not hypothesis.split():
        return 1.0
    return float(jiwer.mer(reference, hypothesis))
