"""Ray, at the edge: the only package that imports `ray`.

`cluster` starts or attaches to Ray and places actors; `pool` is the evaluator pool of GPU-pinned
EvaluatorActors (and CPU build tasks); `ray_backends` builds a `run.engine.Search` whose world model,
planner, coder and evaluators are Ray actors (the classes are in `actors/`, installed as
`ksearch_ray.actors`). Without Ray (`--no-ray`) the run uses `run.local` instead.
"""
