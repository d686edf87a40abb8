"""The detection command lines (det/train.py, det/test.py, det/get_flops.py): the flows of
:mod:`vmamba2d.openmmlab.commands` with the COCO dataset and annotation check, COCO APs (3 decimals,
as mmdet) and the detector's complexity count (with the RPN proposals the RoI heads ran on)."""
from vmamba2d.det.complexity import detector_complexity
from vmamba2d.det.runtime import check_coco_paths
from vmamba2d.openmmlab.commands import Column, EvaluateCommand, FlopsCommand, TrainCommand

# Shown under each command's --help (formatted as written).
_MORE = "\n\n--list prints the configs this package ships; --version the versions in use."

TRAIN = TrainCommand("Train a detector (mmdet config).\n\nexamples:\n"
                     "  vmamba2d-det-train tiny-data_mask-rcnn_vmamba2d-tiny_fpn --from-scratch  # after vmamba2d-tiny-data\n"
                     "  vmamba2d-det-train mask-rcnn_vmamba2d-tiny_fpn_1x_coco --resume\n"
                     "  torchrun --nproc_per_node 8 $(which vmamba2d-det-train) CONFIG --launcher pytorch" + _MORE,
                     config_example="vmamba2d/configs/det/mask-rcnn_vmamba2d-tiny_fpn_1x_coco.py",
                     check_dataset=check_coco_paths)

TEST = EvaluateCommand("Evaluate a detector checkpoint (COCO box / mask AP).\n\nexample:\n"
                        "  vmamba2d-det-test mask-rcnn_vmamba2d-tiny_fpn_1x_coco epoch_12.pth" + _MORE,
                        checkpoint_help="checkpoint file (from det/train.py)",
                        cfg_options_example="test_dataloader.dataset.data_root=... test_evaluator.ann_file=...",
                        check_dataset=check_coco_paths, metric_digits=3, offers_tta=False)

FLOPS = FlopsCommand("Parameters and FLOPs of a detector.\n\nexample:\n"
                     "  vmamba2d-det-flops mask-rcnn_vmamba2d-tiny_fpn_1x_coco --shape 1280 800" + _MORE, default_shape=(1280, 800), scope="mmdet",
                     count=detector_complexity,
                     columns=(Column("params (M)", "params", 1e6, 2), Column("FLOPs (G)", "flops", 1e9, 1),
                              Column("backbone FLOPs (G)", "backbone_flops", 1e9, 1),
                              Column("RPN proposals", "proposals", 1, 0)))
