"""Backend conformance against the ONNX backend node tests (``edgebuild conformance``).

The cases come from the installed ``onnx`` wheel's own generators
(``onnx.backend.test.case.node.collect_testcases``): one small model per case, with inputs,
expected outputs and tolerances. Each case ends as one of

- ``pass`` / ``fail``: the backend ran it; outputs matched (or not) at the case's tolerances;
- ``error``: the backend has lowerings for every op but raised while lowering or running;
- ``unsupported``: a type the backend cannot carry (strings, bfloat16, sequences, ...) or an
  op with no lowering. Unsupported cases stay in the denominator of the pass rate.

A backend takes part by returning a runner from ``Backend.conformance_runner()``
(:mod:`edgebuild.protocols`). Cases run in worker processes with a per-case timeout, so one
hang cannot stall the suite.

Modules, one job each: :mod:`.cases` collects the cases, :mod:`.classify` sets aside those the
backend cannot run, :mod:`.runner` runs one case and :mod:`.compare` judges its outputs,
:mod:`.pool` runs cases in worker processes, :mod:`.suite` runs a whole suite, :mod:`.tables`
summarises and writes the Markdown table, :mod:`.command` is the CLI command (the only module
that prints) and :mod:`.plugin` registers it.
"""
