"""Grid sweeps and hyperparameter searches: the project's Hydra sweepers over the run."""
