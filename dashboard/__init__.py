"""The LayerCheck dashboard (``streamlit run dashboard/app.py``).

Torch-free: it reads traces (``layercheck.contract.trace``), re-decides them with the
library's pure policy (``layercheck.contract.policy``; ``layercheck.contract.fastreplay`` and
``layercheck.contract.lanes`` are its vectorised twins) and runs the simulator (``sim``). Views are thin scripts in
``dashboard/views/`` over the pure modules here, which return numbers, tables
and Plotly figures:

- ``driftmap``: view 1, accumulator heatmap and drift rates;
- ``whatif``: view 2;
- ``mtbf``: view 3, over ``sim``;
- ``fidelity``: view 4, drill.json;
- ``catalog``, ``downloads``: view 5, traces and uploads; CSV and HTML bytes;
- ``myjob``: the My job page, a described job as ``python -m sim``'s command line and its answer;
- ``jobsummary``, ``answerstore``: what that page shows of an answer, kept on disk as JSON
  between servers (keyed by the job and the code);
- ``verdict``, ``tuning``, ``scale``, ``sensitivity``, ``stalecost``: the other pages' tables and figures;
- ``tables``, ``charts``: every table as people read it; log ticks, legend keys, margins;
- ``ui``: the Streamlit glue (cached loaders, trace picker, download buttons, kept widget values);
- ``headless``: a headless ``streamlit run`` of the app, for the browser tests, benchmark and tools.
"""

