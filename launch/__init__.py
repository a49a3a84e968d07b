"""The launcher: `launch` reads a spec, plans every task, runs them on a backend under one run
lifecycle, and keeps the run's records. Layers, top to bottom (setup.cfg's import contracts):
cli > commands > run > backends > render > records > planning > errors and system."""
