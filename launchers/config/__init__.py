"""What a run is: presets, the validated run spec (and its run.json form), hostfiles, the
projections of a spec (argv, DeepSpeed JSON), upstream and GPU prerequisites, and the
standard-library probe of what a node has."""
