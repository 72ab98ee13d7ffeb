#!/usr/bin/env bash
# One hash of the project's sources as they are on disk (ksearch_ray, actors, tasks, experiments,
# tests, pyproject.toml), for GPU scripts to record: the device machine's copy of the tree does not
# carry the sender's git metadata, so `git rev-parse HEAD` there names an older commit. Run the same
# command on the sending machine to match a record with a commit.
cd "$(dirname "$0")/../.." && find ksearch_ray actors tasks experiments tests pyproject.toml -type f \
  \( -name '*.py' -o -name '*.sh' -o -name '*.json' -o -name '*.jsonl' -o -name '*.cu' -o -name '*.h' \
     -o -name '*.cpp' -o -name '*.md' -o -name '*.yaml' -o -name '*.toml' \) -not -path '*/__pycache__/*' -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
