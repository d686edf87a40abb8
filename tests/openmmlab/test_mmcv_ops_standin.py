"""vmamba2d's ``mmcv.ops`` stand-in for mmcv-lite: the ops Mask R-CNN runs (nms, batched_nms,
RoIAlign) against small independent references written from mmcv's documented semantics, the
placeholders of every other op (a clear error when used), and mmdetection on top of it (CPU)."""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("mmcv", reason="mmcv(-lite) is not installed")

from vmamba2d.openmmlab.mmcv_standin.install import (  # noqa: E402
    compat_layer_active,
    compiled_mmcv_ops_available,
    install_mmcv_ops_compat,
)

pytestmark = pytest.mark.skipif(compiled_mmcv_ops_available(),
                                reason="a full mmcv build is installed: the stand-in is not used")

if not compiled_mmcv_ops_available():
    install_mmcv_ops_compat()
    import mmcv.ops as ops  # noqa: E402


# ---------------------------------------------------------------------------------------------
# references
# ---------------------------------------------------------------------------------------------
def _iou(a, b, offset=0.0):
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + offset)
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + offset)
    inter = width * height
    area_a = (a[2] - a[0] + offset) * (a[3] - a[1] + offset)
    area_b = (b[2] - b[0] + offset) * (b[3] - b[1] + offset)
    return inter / (area_a + area_b - inter)


def _reference_nms(boxes, scores, iou_threshold, offset=0.0, groups=None):
    """Greedy NMS over lists: score order (ties by index), drop IoU > threshold within a group."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    kept = []
    for i in order:
        if all(_iou(boxes[i], boxes[j], offset) <= iou_threshold
               for j in kept if groups is None or groups[i] == groups[j]):
            kept.append(i)
    return kept


def _random_boxes(rng, count, size=60.0, low=0.0):
    corners = rng.uniform(low, low + size, (count, 2))
    sides = rng.uniform(2.0, size / 2, (count, 2))
    return np.concatenate([corners, corners + sides], axis=1).astype(np.float32)


def _bilinear(feature, y, x):
    """mmcv's RoIAlign sample: 0 beyond one pixel outside, clamped to the border inside."""
    height, width = feature.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return np.zeros(feature.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_low = y_high = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_low = x_high = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    return ((1 - ly) * (1 - lx) * feature[:, y_low, x_low]
            + (1 - ly) * lx * feature[:, y_low, x_high]
            + ly * (1 - lx) * feature[:, y_high, x_low]
            + ly * lx * feature[:, y_high, x_high])


def _reference_roi_align(features, rois, out_h, out_w, scale, sampling_ratio, aligned):
    features = features.double().numpy()
    output = np.zeros((len(rois), features.shape[1], out_h, out_w))
    shift = 0.5 if aligned else 0.0
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        start_x, start_y = x1 * scale - shift, y1 * scale - shift
        roi_w, roi_h = x2 * scale - shift - start_x, y2 * scale - shift - start_y
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / out_h, roi_w / out_w
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / out_h)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / out_w)
        for ph in range(out_h):
            for pw in range(out_w):
                total = 0.0
                for iy in range(grid_h):
                    y = start_y + ph * bin_h + (iy + 0.5) * bin_h / grid_h
                    for ix in range(grid_w):
                        x = start_x + pw * bin_w + (ix + 0.5) * bin_w / grid_w
                        total = total + _bilinear(features[int(b)], y, x)
                output[k, :, ph, pw] = total / max(grid_h * grid_w, 1)
    return torch.from_numpy(output)


# ---------------------------------------------------------------------------------------------
# module tree
# ---------------------------------------------------------------------------------------------
def test_module_tree_mirrors_mmcv_ops():
    assert compat_layer_active() and install_mmcv_ops_compat()
    from mmcv.ops.merge_cells import ConcatCell, GlobalPoolingCell, SumCell  # noqa: F401
    from mmcv.ops.nms import batched_nms
    from mmcv.ops.roi_align import roi_align

    # as in mmcv, the package attribute is the op, not the submodule of the same name
    assert ops.nms is sys.modules["mmcv.ops.nms"].nms and callable(ops.nms)
    assert ops.batched_nms is batched_nms and ops.roi_align is roi_align
    assert isinstance(ops.RoIAlign(7, spatial_scale=0.25), torch.nn.Module)
    with pytest.raises(ImportError, match="nms_rotated"):
        from mmcv.ops import nms_rotated  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        import mmcv.ops.voxelize  # noqa: F401
    from mmcv.utils import collect_env  # reads mmcv.ops' compiler versions

    assert collect_env()["MMCV Compiler"].startswith("n/a")


NOT_AVAILABLE = r"^mmcv\.ops\.{} is not available without full mmcv \(pip install mmcv==2\.1\.0[^\n]*$"


@pytest.mark.parametrize("submodule, name, use", [
    ("nms", "soft_nms", lambda op: op(np.zeros((2, 4), np.float32), np.ones(2, np.float32))),
    ("nms", "nms_match", lambda op: op(np.zeros((2, 5), np.float32), 0.5)),
    ("roi_pool", "roi_pool", lambda op: op(torch.zeros(1, 1, 4, 4), torch.zeros(1, 5), 2)),
    ("roi_pool", "RoIPool", lambda op: op((3, 2), 0.5)),
    ("point_sample", "point_sample", lambda op: op(torch.zeros(1, 1, 4, 4), torch.zeros(1, 2, 2))),
    ("point_sample", "rel_roi_point_to_rel_img_point", lambda op: op(torch.zeros(1, 5), torch.zeros(1, 2, 2), (4, 4))),
    ("focal_loss", "sigmoid_focal_loss", lambda op: op(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))),
    ("merge_cells", "SumCell", lambda op: op(4, 4)),
    ("merge_cells", "ConcatCell", lambda op: op(4, 4)),
    ("merge_cells", "GlobalPoolingCell", lambda op: op(4, 4)),
    ("corner_pool", "CornerPool", lambda op: op("top")),
    ("carafe", "CARAFEPack", lambda op: op(16, 2)),
    ("modulated_deform_conv", "ModulatedDeformConv2d", lambda op: op(4, 4, 3)),
    ("deform_conv", "DeformConv2d", lambda op: op(4, 4, 3)),
    ("deform_conv", "deform_conv2d", lambda op: op(torch.zeros(1, 1, 3, 3))),
    ("masked_conv", "MaskedConv2d", lambda op: op(4, 4, 3)),
    ("multi_scale_deform_attn", "MultiScaleDeformableAttention", lambda op: op()),
])
def test_ops_our_models_do_not_run_import_and_fail_clearly_when_used(submodule, name, use):
    """mmseg / mmdet import these at module level: the import works, from the package and from
    the submodule mmcv defines it in; building or calling one raises one line naming the op."""
    op = getattr(ops, name)
    assert getattr(sys.modules[f"mmcv.ops.{submodule}"], name) is op
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE.format(name)):
        use(op)


def test_a_subclass_of_a_placeholder_fails_when_built():
    class NasCell(ops.SumCell):  # what a toolkit module defining its own cell does at import
        pass

    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE.format("SumCell")):
        NasCell(4, 4)


def test_placeholders_and_unsupported_options_name_the_problem():
    with pytest.raises(NotImplementedError, match=NOT_AVAILABLE.format("soft_nms")):
        ops.batched_nms(torch.tensor([[0.0, 0, 1, 1]]), torch.ones(1), torch.zeros(1),
                        dict(type="soft_nms", iou_threshold=0.5))
    with pytest.raises(ValueError, match=r"nms_cfg\['type'\]"):
        ops.batched_nms(torch.tensor([[0.0, 0, 1, 1]]), torch.ones(1), torch.zeros(1),
                        dict(type="nms_rotated", iou_threshold=0.5))
    with pytest.raises(NotImplementedError, match=r"^mmcv\.ops\.roi_align with pool_mode='max' is not available without full mmcv"):
        ops.roi_align(torch.zeros(1, 1, 4, 4), torch.tensor([[0.0, 0, 0, 2, 2]]), 2, 1.0, 0, "max")


@pytest.mark.slow
def test_full_mmcv_is_left_alone_and_mmdet_imports_with_the_standin():
    script = textwrap.dedent("""
        import importlib.machinery, logging, sys, types, warnings
        import mmcv
        from vmamba2d.openmmlab.mmcv_standin import install as standin

        fake_ext = types.ModuleType("mmcv._ext")  # what a full mmcv build provides
        fake_ext.__spec__ = importlib.machinery.ModuleSpec("mmcv._ext", None)
        sys.modules["mmcv._ext"] = fake_ext
        assert standin.install_mmcv_ops_compat() is False
        assert "mmcv.ops" not in sys.modules and not standin.compat_layer_active()
        del sys.modules["mmcv._ext"]

        notes = []
        handler = logging.Handler(logging.DEBUG)
        handler.emit = lambda record: notes.append(record.getMessage())
        standin.LOGGER.addHandler(handler)
        standin.LOGGER.setLevel(logging.DEBUG)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert standin.install_mmcv_ops_compat() is True
        assert not [w for w in caught if "stand-in" in str(w.message)]  # a debug note, not a warning
        assert any("stand-in" in note for note in notes) and standin.compat_layer_active()
        import mmdet.apis, mmdet.models  # noqa: F401
        from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
        extractor = SingleRoIExtractor(dict(type="RoIAlign", output_size=7, sampling_ratio=0),
                                       out_channels=8, featmap_strides=[4, 8])
        assert type(extractor.roi_layers[1]).__module__ == "vmamba2d.openmmlab.mmcv_standin.roi_align"
        assert extractor.roi_layers[1].spatial_scale == 1 / 8
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# NMS
# ---------------------------------------------------------------------------------------------
def test_nms_matches_greedy_reference_with_ties_offset_and_thresholds():
    rng = np.random.default_rng(0)
    boxes = _random_boxes(rng, 40)
    scores = rng.choice([0.2, 0.5, 0.7, 0.9], 40).astype(np.float32)  # many ties
    for iou_threshold in (0.1, 0.3, 0.6):
        for offset in (0, 1):
            expected = _reference_nms(boxes.tolist(), scores.tolist(), iou_threshold, offset)
            dets, inds = ops.nms(torch.from_numpy(boxes), torch.from_numpy(scores), iou_threshold,
                                 offset=offset)
            assert inds.tolist() == expected
            torch.testing.assert_close(dets, torch.from_numpy(
                np.concatenate([boxes[expected], scores[expected, None]], axis=1)))
    # numpy in, numpy out; score_threshold drops before NMS, max_num keeps the best
    dets, inds = ops.nms(boxes, scores, 0.3, score_threshold=0.5, max_num=3)
    above = [i for i in range(40) if scores[i] > 0.5]
    expected = [above[i] for i in _reference_nms(boxes[above].tolist(), scores[above].tolist(),
                                                 0.3)][:3]
    assert isinstance(dets, np.ndarray) and isinstance(inds, np.ndarray)
    assert inds.tolist() == expected and dets.shape == (3, 5)


def test_nms_keeps_a_box_whose_iou_equals_the_threshold_and_handles_empty_input():
    boxes = torch.tensor([[0.0, 0, 3, 1], [1.0, 0, 4, 1], [0.0, 0, 3, 1]])  # IoU(0, 1) = 0.5
    _, inds = ops.nms(boxes, torch.tensor([0.9, 0.8, 0.9]), 0.5)
    assert inds.tolist() == [0, 1]  # equal scores: input order; box 2 duplicates box 0
    dets, inds = ops.nms(torch.zeros(0, 4), torch.zeros(0), 0.5)
    assert dets.shape == (0, 5) and inds.shape == (0,) and inds.dtype == torch.long
    with pytest.raises(ValueError, match="boxes must be"):
        ops.nms(torch.zeros(3, 5), torch.zeros(3), 0.5)


def _reference_batched(boxes, scores, labels, iou_threshold):
    kept = _reference_nms(boxes.tolist(), scores.tolist(), iou_threshold,
                          groups=labels.tolist())
    return sorted(kept, key=lambda i: (-scores[i], i))


def test_batched_nms_class_aware_agnostic_and_split_paths_match_reference():
    rng = np.random.default_rng(1)
    boxes = _random_boxes(rng, 60, low=-40.0)  # negative coordinates too
    scores = rng.choice(np.linspace(0.1, 0.9, 9), 60).astype(np.float32)
    labels = rng.integers(0, 4, 60)
    boxes_t, scores_t, labels_t = map(torch.from_numpy, (boxes, scores, labels))

    expected = _reference_batched(boxes, scores, labels, 0.4)
    for split_thr in (10000, 10):  # one NMS with class offsets / one NMS per class
        dets, keep = ops.batched_nms(boxes_t, scores_t, labels_t,
                                     dict(type="nms", iou_threshold=0.4, split_thr=split_thr))
        assert keep.tolist() == expected
        torch.testing.assert_close(dets[:, :4], boxes_t[keep])
        torch.testing.assert_close(dets[:, 4], scores_t[keep])
        dets, keep = ops.batched_nms(boxes_t, scores_t, labels_t,
                                     dict(iou_threshold=0.4, split_thr=split_thr, max_num=5))
        assert keep.tolist() == expected[:5] and dets.shape == (5, 5)

    agnostic = _reference_batched(boxes, scores, np.zeros(60, dtype=int), 0.4)
    assert agnostic != expected
    for cfg, flag in ((dict(iou_threshold=0.4, class_agnostic=True), False),
                      (dict(iou_threshold=0.4, split_thr=10), True)):
        _, keep = ops.batched_nms(boxes_t, scores_t, labels_t, cfg, class_agnostic=flag)
        assert keep.tolist() == agnostic

    # nms_cfg=None only sorts by score (ties in input order)
    dets, keep = ops.batched_nms(boxes_t, scores_t, labels_t, None)
    assert keep.tolist() == sorted(range(60), key=lambda i: (-scores[i], i))
    # empty input
    dets, keep = ops.batched_nms(torch.zeros(0, 4), torch.zeros(0),
                                 torch.zeros(0, dtype=torch.long), dict(iou_threshold=0.5))
    assert dets.shape == (0, 5) and keep.shape == (0,)


# ---------------------------------------------------------------------------------------------
# RoIAlign
# ---------------------------------------------------------------------------------------------
ROIS = torch.tensor([
    [0, 1.0, 2.0, 9.5, 7.0],
    [1, 3.2, 0.4, 6.1, 11.8],
    [0, -6.0, -3.0, 4.0, 5.0],  # partly outside the image
    [1, 13.0, 10.0, 30.0, 20.0],  # partly outside
    [0, 40.0, 40.0, 50.0, 44.0],  # entirely outside
    [1, 5.0, 5.0, 5.3, 5.2],  # smaller than a pixel
])


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5])
def test_roi_align_matches_mmcv_bilinear_sampling(aligned, sampling_ratio, spatial_scale):
    torch.manual_seed(0)
    features = torch.randn(2, 3, 8, 9)
    scaled = features if spatial_scale == 1.0 else torch.randn(2, 3, 6, 8)
    expected = _reference_roi_align(scaled, ROIS, 3, 2, spatial_scale, sampling_ratio, aligned)
    layer = ops.RoIAlign((3, 2), spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                         aligned=aligned)
    torch.testing.assert_close(layer(scaled, ROIS).double(), expected, rtol=1e-5, atol=1e-5)


def test_roi_align_gradient():
    torch.manual_seed(0)
    features = torch.randn(2, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 0.7, 1.2, 4.1, 3.9], [1, -1.0, 0.5, 3.0, 6.0]], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: ops.roi_align(x, rois, (2, 3), 1.0, 0, "avg", True), (features,))
    # rois in float32 with a float64 map (mmdet builds rois in float32)
    out = ops.roi_align(features, rois.float(), 2, 1.0, 2, "avg", False)
    assert out.dtype == torch.float64 and out.shape == (2, 2, 2, 2)
    assert ops.roi_align(features, torch.zeros(0, 5), 2).shape == (0, 2, 2, 2)


def test_bitmap_masks_crop_and_resize_is_crop_then_area_resize():
    from mmdet.structures.mask import BitmapMasks

    rng = np.random.default_rng(3)
    masks = (rng.uniform(size=(3, 20, 24)) > 0.5).astype(np.uint8)
    # boxes with integer corners and sides twice the output: each output pixel averages 2x2 pixels
    boxes = np.array([[2, 4, 10, 12], [0, 0, 8, 8], [14, 6, 22, 14]], dtype=np.float32)
    inds = np.array([1, 0, 2])
    resized = BitmapMasks(masks, 20, 24).crop_and_resize(boxes, (4, 4), inds, binarize=False)
    expected = np.stack([masks[i, y1:y2, x1:x2].reshape(4, 2, 4, 2).mean(axis=(1, 3))
                         for i, (x1, y1, x2, y2) in zip(inds, boxes.astype(int))])
    np.testing.assert_allclose(resized.masks, expected, atol=1e-6)
    binary = BitmapMasks(masks, 20, 24).crop_and_resize(boxes, (4, 4), inds)
    np.testing.assert_array_equal(binary.masks, expected >= 0.5)
