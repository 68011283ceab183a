"""The command-line pipelines (``dp-select-partitions``, ``dp-extract-ngrams``, ...).

Importing this package (every CLI does, before Beam or pyarrow) makes Arrow allocate with the system
allocator unless ``ARROW_DEFAULT_MEMORY_POOL`` is set already: pyarrow's own default (mimalloc in its
wheels) kept ~100-140 MB more resident memory at the peak of a 4M-pair run, for no speed
(docs/columnar.md, "Memory"). Arrow reads the variable once, when pyarrow is first imported: a process
that imported pyarrow before this package keeps its allocator.
"""

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
