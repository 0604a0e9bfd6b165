"""The engine, laid out as upstream's v1: core (scheduler, cache manager), worker (model runner),
sample (sampler), engine (step loop, detokenizer)."""
