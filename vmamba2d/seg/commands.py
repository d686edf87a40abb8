"""The segmentation command lines (seg/train.py, seg/test.py, seg/get_flops.py): the flows of
:mod:`vmamba2d.openmmlab.commands` with the ADE20K dataset check, mIoU (2 decimals, as mmseg), the
multi-scale + flip test and the segmentor's complexity count."""
from vmamba2d.openmmlab.commands import Column, EvaluateCommand, FlopsCommand, TrainCommand
from vmamba2d.openmmlab.complexity import segmentor_complexity
from vmamba2d.seg.runtime import check_dataset_folders

# Shown under each command's --help (formatted as written).
_MORE = "\n\n--list prints the configs this package ships; --version the versions in use."

TRAIN = TrainCommand("Train a segmentor (mmseg config).\n\nexamples:\n"
                     "  vmamba2d-seg-train tiny-data_upernet_vmamba2d_tiny --from-scratch  # after vmamba2d-tiny-data\n"
                     "  vmamba2d-seg-train upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512 --resume\n"
                     "  torchrun --nproc_per_node 4 $(which vmamba2d-seg-train) CONFIG --launcher pytorch" + _MORE,
                     config_example="vmamba2d/configs/seg/upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512.py",
                     check_dataset=check_dataset_folders)

TEST = EvaluateCommand("Evaluate a segmentor checkpoint (mIoU).\n\nexamples:\n"
                        "  vmamba2d-seg-test upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512 iter_160000.pth --tta\n"
                        "  vmamba2d-seg-test my_config.py best.pth --cfg-options test_dataloader.dataset.data_root=DIR"
                        + _MORE,
                        checkpoint_help="checkpoint file (from seg/train.py)",
                        cfg_options_example="test_dataloader.dataset.data_root=...",
                        check_dataset=check_dataset_folders, metric_digits=2, offers_tta=True)

FLOPS = FlopsCommand("Parameters and FLOPs of a segmentor.\n\nexample:\n"
                     "  vmamba2d-seg-flops upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512 --shape 512 2048" + _MORE, default_shape=(512, 2048), scope="mmseg",
                     count=segmentor_complexity,
                     columns=(Column("params (M)", "params", 1e6, 2),
                              Column("params w/o aux head (M)", "params_inference", 1e6, 2),
                              Column("FLOPs (G)", "flops", 1e9, 1)))
