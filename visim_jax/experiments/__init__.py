"""One module per experiment, wiring only: config -> data -> features -> train (through visim_jax.training.runtime) ->
eval -> report. `visim_jax.main` calls `<module>.run(config, workdir)` for config.experiment."""
