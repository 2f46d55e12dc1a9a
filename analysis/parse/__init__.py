"""Parsing of training logs into typed runs. ``python -m analysis.parse LOG... --json``.

Its public face: ``reader`` (``parse_file``, ``parse_text``, ``parse_lines``, ``merge_runs``,
``strict``) and ``records`` (``ParsedRun`` and the record types the metrics read).

Inside, imports point one way (a module imports only those below it):

- ``reader``: the entry points, the chunked file driver, ``--json``;
- ``bulk`` (``Bulk``): the bulk path, the high-volume records of a training phase read a
  stretch at a time by the per-family extractors of ``extract`` and assigned to iterations
  and steps with ``np.searchsorted``, with the line path's result;
- ``machine`` (``Core``): the line state machine (runs, set-up, blocks, streams), with
  ``failures`` (how a failure is recorded), ``merge`` (a run finished; per-node files joined),
  ``rules`` (patterns, keywords, per-run and per-stream state) and ``keywords`` (the scan);
- ``records``, ``tables``, ``storage``, ``columns``: the records and the numpy columns that
  hold them; ``lines``: launcher prefixes and value readers.

docs/parsing.md says what each module owns.
"""
