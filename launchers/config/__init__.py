"""What a run is: presets, the validated run spec, hostfiles, the projections of a spec (argv,
DeepSpeed JSON), upstream and GPU prerequisites."""
