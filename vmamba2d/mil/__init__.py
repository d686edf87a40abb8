"""2DMambaMIL: whole-slide-image MIL on per-slide patch features (docs/mil.md).

Models (the package ``vmamba2d.mil.models``: 2DMambaMIL and the baselines): ``MambaMIL2D``,
``MambaMIL``, ``ABMIL``, ``CLAMSB``, ``DSMIL``, ``DTFDMIL``, ``TransMIL``, ``S4MIL``, ``MambaMILSR``, ``MODELS``
(by name), ``build_model``, ``model_from_checkpoint``. Data (``vmamba2d.mil.data``): slide files ->
grid placement -> ``SlideDataset`` of ``SlideRecord``. Heatmaps: ``vmamba2d.mil.heatmap``. Training / metrics / survival modules are
imported by their full paths (``vmamba2d.mil.<module>``). From slides (the ``slides`` extra):
``vmamba2d.mil.slides`` (reading, tissue, patching, thumbnails), ``vmamba2d.mil.extract`` (features
in CLAM's format), ``vmamba2d.mil.predict`` (predictions and heatmaps of a trained run).
"""
from .data.dataset import SlideDataset, SlideRecord
from .data.grid import GridOptions, place_on_grid
from .data.slide_files import read_slide_file
from .data.tables import SlideEntry, read_label_csv, read_split_csv, read_survival_csv
from .models import (ABMIL, CLAMSB, DSMIL, DTFDMIL, MODELS, S4MIL, MambaMIL, MambaMIL2D, MambaMILSR, TransMIL,
                     build_model, model_from_checkpoint)

__all__ = [
    "ABMIL",
    "CLAMSB",
    "DSMIL",
    "DTFDMIL",
    "GridOptions",
    "MODELS",
    "MambaMIL",
    "MambaMIL2D",
    "MambaMILSR",
    "S4MIL",
    "SlideDataset",
    "SlideEntry",
    "SlideRecord",
    "TransMIL",
    "build_model",
    "model_from_checkpoint",
    "place_on_grid",
    "read_label_csv",
    "read_slide_file",
    "read_split_csv",
    "read_survival_csv",
]
