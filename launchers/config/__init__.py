"""What a run is: presets, the validated run spec (and its run.json form), hostfiles, the
projections of a spec (argv, DeepSpeed JSON), upstream and GPU prerequisites (apex's needed
extensions, ``make gpu-check``, the machine's own PyTorch), the wheelhouse for nodes without
network, and the standard-library probe of what a node has."""
