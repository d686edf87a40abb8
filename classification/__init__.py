"""Command-line entry points of the ImageNet scripts; the code is :mod:`vmamba2d.classification`."""
