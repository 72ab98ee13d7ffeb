"""Ray actor classes: thin wrappers that hold state and do I/O around the pure core in ksearch_ray."""
