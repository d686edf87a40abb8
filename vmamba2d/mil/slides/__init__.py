"""From whole-slide images to patches (docs/mil.md#from-slides); needs the ``slides`` extra.

    slide = open_slide("a.svs")                            # reader: OpenSlide formats, plain pyramidal TIFF
    tissue = detect_tissue(slide, TissueOptions())         # tissue: CLAM-style mask at a low-resolution level
    grid = patch_grid(slide, tissue, PatchOptions())       # patching: level-0 coords of the tissue patches
    draw_thumbnail(slide, tissue, grid).save("a.png")      # thumbnail: contours and the patch grid

Modules: ``reader`` (``open_slide``, ``Slide``, ``SlideError``), ``tissue`` (``TissueOptions``,
``TissueMask``, ``detect_tissue``, ``otsu_threshold``), ``patching`` (``PatchOptions``,
``PatchGrid``, ``patch_grid``), ``thumbnail`` (``draw_thumbnail``).
"""
from .patching import PatchGrid, PatchOptions, patch_grid
from .reader import SLIDE_SUFFIXES, Slide, SlideError, find_slides, open_slide
from .thumbnail import draw_thumbnail
from .tissue import TissueMask, TissueOptions, detect_tissue, otsu_threshold

__all__ = ["PatchGrid", "PatchOptions", "SLIDE_SUFFIXES", "Slide", "SlideError", "TissueMask", "TissueOptions",
           "detect_tissue", "draw_thumbnail", "find_slides", "open_slide", "otsu_threshold", "patch_grid"]
