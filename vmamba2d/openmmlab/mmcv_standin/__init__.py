"""vmamba2d's stand-in for ``mmcv.ops`` under mmcv-lite (no compiled ``mmcv._ext``).

:mod:`.install` builds and installs the ``mmcv.ops`` module tree; :mod:`.nms` and
:mod:`.roi_align` are the ops UperNet and Mask R-CNN run; :mod:`.unavailable` the placeholders for
every other op mmseg / mmdet import.
"""
