"""Static analyses of the models that need no GPU (the byte account: :mod:`vmamba2d.analysis.traffic`)."""
