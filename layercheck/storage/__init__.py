"""The checkpoint on disk and its I/O: what a directory holds and how it is written, read and kept.

- the format: ``format`` (file keys, manifest records: one torch-free module; ``schema``,
  ``version``, ``layout`` its parts), ``layerfile`` (a layer version's file, written) and
  ``layerread`` (read and verified), ``views`` (tensors over a file read),
  ``checksums`` and ``fingerprint`` (of bytes and of tensors), ``pretrained`` (frozen
  weights held by reference to a pretrained file);
- the log: ``manifest`` (the committed records, read and sealed);
- the stores: ``store`` (the protocol, its path rules), ``localstore``, ``fsspecstore``,
  ``lock`` (the directory's locks), ``fds`` (descriptors of regular files),
  ``location`` (which store a path or URL names: ``open_store``);
- the writing: ``writer`` (persist in the background), ``commit`` (when a version is
  committed, by one rank or all), ``retention`` (which superseded versions go).

Imports only ``layercheck.contract`` besides itself: no backend, no lifecycle, no tool.
"""
