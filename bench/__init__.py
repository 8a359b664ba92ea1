"""Speed benchmarks (model level, server level, against peer servers, batch jobs, the GPU kit); each writes JSON
under bench/results/. Quality lives in evals/. Figures and how they were taken: docs/benchmarks.md."""
