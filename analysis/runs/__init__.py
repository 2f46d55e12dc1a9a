"""Runs as found on disk: discovery of run directories and bare logs, the run record (``run.json``),
the resolved setup of each run, and the problems found while loading."""
