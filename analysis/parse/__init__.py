"""Parsing of training logs into typed runs. ``python -m analysis.parse LOG... --json``.

Its public face: ``reader`` (``parse_file``, ``parse_text``, ``parse_lines``, ``merge_runs``,
``strict``) and ``records`` (``ParsedRun`` and the record types the metrics read).

Inside, imports point one way (a module imports only those below it):

- ``reader``: the entry points, the chunked file driver, ``--json``;
- ``scan`` (``Bulk``) with its collaborators ``scan_readers``, ``scan_shapes`` and the byte
  patterns of ``scan_blocks`` and ``scan_bytes``: the bulk path, frequent lines of a training
  phase read many at a time, with the line path's result;
- ``machine`` (``Core``): the line state machine (runs, set-up, blocks, streams), with
  ``failures`` (how a failure is recorded), ``merge`` (a run finished; per-node files joined),
  ``rules`` (patterns, keywords, per-run and per-stream state) and ``keywords`` (the scan);
- ``records``, ``tables``, ``storage``, ``columns``, ``encoding``: the records and the typed
  columns that hold them; ``lines``: launcher prefixes and value readers.
"""
