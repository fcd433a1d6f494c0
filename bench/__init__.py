"""EnMasse-py benchmarks: figures, never assertions. `python -m bench --list` shows the suites;
bench/README.md says how to run and add them, bench/RESULTS.md holds recorded figures."""
