"""Runs as found on disk: discovery of run directories and bare logs, the run record (``run.json``),
the setup resolved from every source of a run, which runs are repeats of one spec, and the
problems found while loading."""
