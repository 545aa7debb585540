"""The model card (`README.md`) of a saved model folder, rendered from plain data.

sentence-transformers writes a README.md into every model it saves; so does csekit, so a folder says
where it came from: the base model, the recipe, the corpus, the step and dev score it was kept for,
how to load it, and which papers to cite. The card is rendered from plain values (no torch, no
recipe objects), so it can be tested on its own and written by the encoder without knowing the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from csekit.core.report_cells import markdown_row

CARD_FILE = "README.md"

BIBTEX: Mapping[str, str] = {
    "simcse": """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  pages = {6894--6910},
  year = {2021},
  eprint = {2104.08821},
  archivePrefix = {arXiv}
}""",
    "dclr": """@inproceedings{zhou2022dclr,
  title = {Debiased Contrastive Learning of Unsupervised Sentence Representations},
  author = {Zhou, Kun and Zhang, Beichen and Zhao, Wayne Xin and Wen, Ji-Rong},
  booktitle = {Proceedings of the 60th Annual Meeting of the Association for Computational Linguistics (ACL)},
  pages = {6120--6130},
  year = {2022},
  eprint = {2205.00656},
  archivePrefix = {arXiv}
}""",
    "whitenedcse": """@inproceedings{zhuo2023whitenedcse,
  title = {{WhitenedCSE}: Whitening-based Contrastive Learning of Sentence Embeddings},
  author = {Zhuo, Wenjie and Sun, Yifan and Wang, Xiaohan and Zhu, Linchao and Yang, Yi},
  booktitle = {Proceedings of the 61st Annual Meeting of the Association for Computational Linguistics (ACL)},
  year = {2023},
  eprint = {2305.17746},
  archivePrefix = {arXiv}
}""",
    "slt_fai": """@article{wang2023sltfai,
  title = {Unsupervised Sentence Representation Learning with Frequency-induced Adversarial Tuning and
           Incomplete Sentence Filtering},
  author = {Wang, Bing and Li, Ximing and Yang, Zhiyao and Guan, Yuanyuan and Li, Jiayin and Wang, Shengsheng},
  journal = {arXiv preprint arXiv:2305.08655},
  year = {2023}
}""",
    "osscse": """@inproceedings{shi2023osscse,
  title = {{OssCSE}: Overcoming Surface Structure Bias in Contrastive Learning for Unsupervised Sentence Embedding},
  author = {Shi, Zhan and Wang, Guoyin and Bai, Ke and Li, Jiwei and Li, Xiang and Cui, Qingjun and Zeng, Belinda
            and Chilimbi, Trishul and Zhu, Xiaodan},
  booktitle = {Proceedings of the 2023 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2023},
  url = {https://aclanthology.org/2023.emnlp-main.448}
}""",
    "mixcse": """@inproceedings{zhang2022mixcse,
  title = {Unsupervised Sentence Representation via Contrastive Learning with Mixing Negatives},
  author = {Zhang, Yanzhao and Zhang, Richong and Mensah, Samuel and Liu, Xudong and Mao, Yongyi},
  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},
  year = {2022}
}""",
    "promptbert": """@inproceedings{jiang2022promptbert,
  title = {{PromptBERT}: Improving {BERT} Sentence Embeddings with Prompts},
  author = {Jiang, Ting and Jiao, Jian and Huang, Shaohan and Zhang, Zihan and Wang, Deqing and Zhuang, Fuzhen
            and Wei, Furu and Huang, Haizhen and Deng, Denvy and Zhang, Qi},
  booktitle = {Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2022},
  eprint = {2201.04337},
  archivePrefix = {arXiv}
}""",
    "sncse": """@article{wang2022sncse,
  title = {{SNCSE}: Contrastive Learning for Unsupervised Sentence Embedding with Soft Negative Samples},
  author = {Wang, Hao and Li, Yangguang and Huang, Zhen and Dou, Yong and Kong, Lingpeng and Shao, Jing},
  journal = {arXiv preprint arXiv:2201.05979},
  year = {2022}
}""",
    "esimcse": """@inproceedings{wu2022esimcse,
  title = {{ESimCSE}: Enhanced Sample Building Method for Contrastive Learning of Unsupervised Sentence Embedding},
  author = {Wu, Xing and Gao, Chaochen and Zang, Liangjun and Han, Jizhong and Wang, Zhongyuan and Hu, Songlin},
  booktitle = {Proceedings of the 29th International Conference on Computational Linguistics (COLING)},
  year = {2022},
  eprint = {2109.04380},
  archivePrefix = {arXiv}
}""",
    "contrastive_tension": """@inproceedings{carlsson2021semantic,
  title = {Semantic Re-tuning with Contrastive Tension},
  author = {Carlsson, Fredrik and Gyllensten, Amaru Cuba and Gogoulou, Evangelia and Hellqvist, Erik Ylip{\\"a}{\\"a}
            and Sahlgren, Magnus},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year = {2021},
  url = {https://openreview.net/forum?id=Ov_sMNau-PF}
}""",
    "matryoshka": """@inproceedings{kusupati2022matryoshka,
  title = {Matryoshka Representation Learning},
  author = {Kusupati, Aditya and Bhatt, Gantavya and Rege, Aniket and Wallingford, Matthew and Sinha, Aditya
            and Ramanujan, Vivek and Howard-Snyder, William and Chen, Kaifeng and Kakade, Sham and Jain, Prateek
            and Farhadi, Ali},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2022},
  eprint = {2205.13147},
  archivePrefix = {arXiv}
}""",
    "rankcse": """@inproceedings{liu2023rankcse,
  title = {{RankCSE}: Unsupervised Sentence Representations Learning via Learning to Rank},
  author = {Liu, Jiduan and Liu, Jiahao and Wang, Qifan and Wang, Jingang and Wu, Wei and Xian, Yunsen and Zhao, Dongyan
            and Chen, Kai and Yan, Rui},
  booktitle = {Proceedings of the 61st Annual Meeting of the Association for Computational Linguistics (ACL)},
  year = {2023},
  eprint = {2305.16726},
  archivePrefix = {arXiv}
}""",
    "consert": """@inproceedings{yan2021consert,
  title = {{ConSERT}: A Contrastive Framework for Self-Supervised Sentence Representation Transfer},
  author = {Yan, Yuanmeng and Li, Rumei and Wang, Sirui and Zhang, Fuzheng and Wu, Wei and Xu, Weiran},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics and the
               11th International Joint Conference on Natural Language Processing (ACL-IJCNLP)},
  pages = {5065--5075},
  year = {2021},
  eprint = {2105.11741},
  archivePrefix = {arXiv}
}""",
    "contriever": """@article{izacard2022contriever,
  title = {Unsupervised Dense Information Retrieval with Contrastive Learning},
  author = {Izacard, Gautier and Caron, Mathilde and Hosseini, Lucas and Riedel, Sebastian and Bojanowski, Piotr
            and Joulin, Armand and Grave, Edouard},
  journal = {Transactions on Machine Learning Research},
  year = {2022},
  eprint = {2112.09118},
  archivePrefix = {arXiv}
}""",
    "cropping": """@article{gonzalezmarquez2026cropping,
  title = {Cropping Outperforms Dropout as an Augmentation Strategy for Self-Supervised Training of Text Embeddings},
  author = {Gonz{\\'a}lez-M{\\'a}rquez, Rita and Berens, Philipp and Kobak, Dmitry},
  journal = {Transactions on Machine Learning Research},
  year = {2026},
  eprint = {2508.03453},
  archivePrefix = {arXiv}
}""",
    "tsdae": """@inproceedings{wang2021tsdae,
  title = {{TSDAE}: Using Transformer-based Sequential Denoising Auto-Encoder for Unsupervised Sentence Embedding
           Learning},
  author = {Wang, Kexin and Reimers, Nils and Gurevych, Iryna},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2021},
  pages = {671--688},
  year = {2021},
  eprint = {2104.06979},
  archivePrefix = {arXiv}
}""",
    "diffcse": """@inproceedings{chuang2022diffcse,
  title = {{DiffCSE}: Difference-based Contrastive Learning for Sentence Embeddings},
  author = {Chuang, Yung-Sung and Dangovski, Rumen and Luo, Hongyin and Zhang, Yang and Chang, Shiyu
            and Solja{\\v{c}}i{\\'c}, Marin and Li, Shang-Wen and Yih, Wen-tau and Kim, Yoon and Glass, James},
  booktitle = {Annual Conference of the North American Chapter of the Association for Computational Linguistics
               (NAACL)},
  year = {2022},
  eprint = {2204.10298},
  archivePrefix = {arXiv}
}""",
}
"""BibTeX by method: venues, pages and arXiv ids as the papers in docs cite them (pages only where confirmed)."""


def _part_names(recipe: Mapping[str, Any]) -> dict[str, list[str]]:
    """The part names a recipe (as `dataclasses.asdict` gives it) uses, by kind."""
    model, data = recipe.get("model", {}), recipe.get("data", {})
    weighting = recipe.get("weighting")
    return {
        "pooler": [str(model.get("pooler", ""))],
        "head": [str((model.get("head") or {}).get("name", ""))],
        "views": [str((data.get("views") or {}).get("name", ""))],
        "negatives": [str(part.get("name", "")) for part in recipe.get("negatives") or ()],
        "weighting": [str(weighting.get("name", ""))] if weighting else [],
        "objectives": [str(part.get("name", "")) for part in _with_inner(recipe.get("objectives") or ())],
    }


def _with_inner(specs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Part specs and the specs a wrapper holds (matryoshka's `objective`), so a wrapped method is cited too."""
    found: list[Mapping[str, Any]] = []
    for spec in specs:
        found.append(spec)
        inner = spec.get("objective")
        if isinstance(inner, Mapping):
            found += _with_inner([inner])
    return found


def methods_used(recipe: Mapping[str, Any] | None, pooler: str) -> list[str]:
    """The methods (BIBTEX keys) whose parts a model was made with; SimCSE always.

    Without a recipe (a model saved outside training) only the pooler is known.
    """
    parts = _part_names(recipe) if recipe else {"pooler": [pooler]}
    names = {name for kind in parts.values() for name in kind}
    objectives = set(parts.get("objectives", ()))
    chosen = ["simcse"]
    if names & {"dclr_noise", "dclr_code"} or "dclr" in parts.get("weighting", ()):
        chosen.append("dclr")
    if "whitening" in parts.get("head", ()) or "multi_positive" in objectives:
        chosen.append("whitenedcse")
    if any(name.startswith("slt_fai") for name in objectives):
        chosen.append("slt_fai")
    # The mask pooler (OssCSE's default templates) is SNCSE's representation too when its loss is there.
    if objectives & {"margin", "recall"} or ("mask" in parts.get("pooler", ()) and "bml" not in objectives):
        chosen.append("osscse")
    if "consert" in parts.get("views", ()):
        chosen.append("consert")
    if "mixcse" in names:
        chosen.append("mixcse")
    if "mask_denoised" in parts.get("pooler", ()):
        chosen.append("promptbert")
    if "bml" in objectives:
        chosen.append("sncse")
    if "repetition" in parts.get("views", ()) or "momentum_queue" in parts.get("negatives", ()):
        chosen.append("esimcse")
    if "rank_distill" in objectives:
        chosen.append("rankcse")
    if "contrastive_tension" in objectives:
        chosen.append("contrastive_tension")
    if "matryoshka" in objectives:
        chosen.append("matryoshka")
    if "cropping" in parts.get("views", ()):
        chosen += ["contriever", "cropping"]
    if "tsdae" in objectives or "deletion" in parts.get("views", ()):
        chosen.append("tsdae")
    if "diffcse" in objectives or "batchnorm_mlp" in parts.get("head", ()):
        chosen.append("diffcse")
    return chosen


def _options(spec: Mapping[str, Any]) -> str:
    """`name (key=value, ...)` for one part spec."""
    options = ", ".join(f"{key}={value}" for key, value in spec.items() if key != "name")
    return f"{spec.get('name')} ({options})" if options else str(spec.get("name"))


def _recipe_section(recipe: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
    model, data, train = recipe.get("model", {}), recipe.get("data", {}), recipe.get("train", {})
    weighting = recipe.get("weighting")
    objectives = recipe.get("objectives") or []
    rows: list[tuple[str, Any]] = [
        ("recipe", recipe.get("name")),
        ("pooler", model.get("pooler")),
        (
            "head",
            _options(model.get("head") or {})
            + (" (kept at test time)" if model.get("head_at_test") else " (training only)"),
        ),
        ("views", _options(data.get("views") or {})),
        ("negatives", "; ".join(_options(part) for part in recipe.get("negatives") or ()) or "in-batch only"),
        ("weighting", _options(weighting) if weighting else "none"),
        ("objectives", "; ".join(f"{_options(part)}, weight {part.get('weight', 1.0)}" for part in objectives)),
        ("batch size (sentences)", train.get("batch_size")),
        ("learning rate", train.get("lr")),
        ("steps", f"{facts.get('step')} of {facts.get('total_steps')}"),
        ("max_length (tokens)", model.get("max_length")),
        ("precision", facts.get("precision", train.get("precision"))),
        ("seed", train.get("seed")),
    ]
    lines = ["## Training", "", "| setting | value |", "| --- | --- |"]
    lines += [markdown_row([key, value]) for key, value in rows]
    return lines


UNSCALED_SCORES = frozenset({"align", "uniform"})
"""Scores that are distances, not correlations: printed as they are, not x100."""


def _score(task: str, value: float) -> str:
    return f"{value:.4f}" if task in UNSCALED_SCORES else f"{value * 100:.2f}"


def score_rows(scores: Mapping[str, Any]) -> dict[str, float | None]:
    """The card's rows of an evaluation result's layout ({"tasks": ..., "averages": ...}, see
    csekit.evaluation.result): a task's named scores as `task key` rows (the align task's as `align` and
    `uniform`), then the averages; a flat mapping of scores (a card of an older csekit) as it is."""
    if "tasks" not in scores and "averages" not in scores:
        return dict(scores)
    rows: dict[str, float | None] = {}
    for task, value in (scores.get("tasks") or {}).items():
        if isinstance(value, Mapping):
            rows.update({key if task == "align" else f"{task} {key}": item for key, item in value.items()})
        else:
            rows[task] = value
    rows.update(scores.get("averages") or {})
    return rows


def before_after_lines(start: Mapping[str, Any], best: Mapping[str, Any], best_step: int | None) -> list[str]:
    """One table of every dev score at the start (step 0) and at best/; both flat (metrics.jsonl's keys) or both
    in the result layout (`score_rows`). A score missing on one side is shown as n/a."""
    start_rows, best_rows = score_rows(start), score_rows(best)
    title = "best/ (the start)" if best_step == 0 else f"best/ (step {best_step})"
    lines = [markdown_row(["dev score", "start (step 0)", title]), "| --- | --- | --- |"]
    for task in dict.fromkeys([*start_rows, *best_rows]):
        cells = [row.get(task) for row in (start_rows, best_rows)]
        shown = ["n/a" if value is None else _score(task, value) for value in cells]
        lines.append(markdown_row([task, *shown]))
    return lines


def _training_sections(facts: Mapping[str, Any]) -> list[str]:
    """The recipe, corpus, step, dev score and evaluation table of a model saved by the trainer."""
    recipe = facts.get("recipe") or {}
    corpus = recipe.get("data", {}).get("corpus")
    lines = [*_recipe_section(recipe, facts), ""]
    lines.append(f"Corpus: `{corpus}`, {facts.get('corpus_sentences', 0):,} sentences.")
    metric, scores = facts.get("select_metric"), score_rows(facts.get("scores") or {})
    if scores.get(metric) is not None:
        lines += [
            "",
            f"Dev score (selection metric): {metric} = {scores[metric] * 100:.2f} at step {facts.get('step')}.",
        ]
    if scores:
        lines += ["", "## Evaluation", "", f"Dev scores at step {facts.get('step')}.", "", "| task | score |"]
        lines += ["| --- | --- |", *(markdown_row([task, _score(task, value)]) for task, value in scores.items())]
    start = facts.get("start_scores")
    if start and scores:
        step = facts.get("step")
        kept = " No evaluated step beat it: this is the starting model." if step == 0 else ""
        lines += ["", "## Before and after training", "", f"The starting model was scored at step 0.{kept}", ""]
        lines += before_after_lines(start, facts.get("scores") or {}, step)
    return lines


NOT_IN_SENTENCE_TRANSFORMERS = {"mask": "The prompt (mask) pooler", "mean_text": "The mean without BOS (mean_text)"}
"""The poolers a saved model cannot be used with in sentence-transformers (its modules.json names a refusal)."""


def _usage(pooler: str) -> list[str]:
    st_usage = (
        [
            "```python",
            "from sentence_transformers import SentenceTransformer",
            "",
            'model = SentenceTransformer("path/to/this/folder")',
            'embeddings = model.encode(["A sentence.", "Another one."])',
            "```",
            "",
        ]
        if pooler not in NOT_IN_SENTENCE_TRANSFORMERS
        else [
            f"{NOT_IN_SENTENCE_TRANSFORMERS[pooler]} has no sentence-transformers module: load this model with csekit.",
            "",
        ]
    )
    return [
        "## Usage",
        "",
        *st_usage,
        "```python",
        "from csekit import SentenceEncoder",
        "",
        'encoder = SentenceEncoder.load("path/to/this/folder")',
        'embeddings = encoder.encode(["A sentence.", "Another one."])',
        "```",
    ]


def render_model_card(
    *, base_model: str | None, pooler: str, csekit_version: str, facts: Mapping[str, Any] | None
) -> str:
    """The README.md of a saved model; `facts` (from training) is None for a model saved outside training.

    `facts` keys: recipe (the recipe as plain dicts), corpus_sentences, step, total_steps, precision,
    select_metric, scores (the dev scores at `step`, as fractions, in the layout {"tasks": ..., "averages": ...}).
    """
    recipe = (facts or {}).get("recipe")
    base = (recipe or {}).get("model", {}).get("backbone") or base_model or "unknown"
    methods: Sequence[str] = methods_used(recipe, pooler)
    lines = [
        "---",
        "library_name: sentence-transformers",
        "pipeline_tag: sentence-similarity",
        "tags: [sentence-transformers, sentence-similarity, feature-extraction, csekit]",
        "---",
        "",
        f"# {(recipe or {}).get('name') or 'csekit sentence encoder'}",
        "",
        f"A sentence encoder saved by csekit {csekit_version}. Base model: `{base}`; pooler: `{pooler}`.",
        "",
    ]
    if facts:
        lines += [*_training_sections(facts), ""]
    lines += [*_usage(pooler), "", "## Citation", "", "```bibtex"]
    lines += "\n\n".join(BIBTEX[method] for method in methods).splitlines()
    lines += ["```", ""]
    return "\n".join(lines)
