"""Whole-slide-image MIL data: per-slide feature files -> per-slide grid -> ``SlideDataset``.

Modules, one job each: :mod:`.slide_files` (find, read and check a slide's feature file),
:mod:`.grid` (place its patches on a grid: ``GridOptions``, ``place_on_grid``, ``prepare_slide``),
:mod:`.tables` (label / survival / split CSV tables -> ``SlideEntry``), :mod:`.dataset`
(``SlideDataset`` of ``SlideRecord``), :mod:`.errors` (``SlideDataError``).
"""
