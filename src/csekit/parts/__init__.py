"""The parts a method is made of, one folder per kind; a recipe names them (see `csekit.core.registry`).

    views/       how each sentence's inputs are made   dropout (SimCSE), consert (ConSERT's), repetition (ESimCSE)
    heads/       pooled vector -> training vector      mlp, none, whitening (WhitenedCSE)
    negatives/   extra negatives                       dclr_noise (DCLR), mixcse, momentum_queue (ESimCSE)
    weighting/   weights of in-batch negatives         dclr (DCLR's complementary model)
    objectives/  loss terms -> named loss parts        infonce, multi_positive, dclr_code, bml (SNCSE), ...

Parts talk to each other only through `state.StepState`; optional hooks are declared in `hooks.py`.
"""
