"""``synthetic:GENERATOR:KEY=VALUE,...``: a seeded graph from ``partitioning.synthetic`` (rmat, sbm),
split at random by the shared split options."""
from __future__ import annotations

from partitioning.graph import GraphData, InputError
from partitioning.spec import SPLIT_OPTIONS, Options, build_graph, parse_options
from partitioning.synthetic import GENERATORS


def load_synthetic(rest: str, spec: str) -> GraphData:
    kind, _, optext = rest.partition(":")
    if kind not in GENERATORS:
        raise InputError(spec, f"unknown generator '{kind}' (expected one of: {', '.join(GENERATORS)})")
    gen, allowed = GENERATORS[kind]
    opts = Options(parse_options(optext, spec), spec, allowed | SPLIT_OPTIONS)
    n, src, dst, feats, labels, classes, info = gen(opts)
    masks, split_info = opts.split_masks(n)
    return build_graph(info["dataset"], n, (src, dst), feats, labels, classes, masks, {**info, **split_info},
                       opts.symmetric, spec)
