"""MIL data layer (vmamba2d.mil.data): slide files, grid placement, caps, tables, the dataset and
every bad input."""
import dataclasses

import h5py
import numpy as np
import pytest
import torch

from vmamba2d.mil import MambaMIL2D
from vmamba2d.mil.data.dataset import SlideDataset
from vmamba2d.mil.data.errors import SlideDataError
from vmamba2d.mil.data.grid import GridOptions, grid_to_pixels, infer_patch_step, place_on_grid, pool_2x2, prepare_slide
from vmamba2d.mil.data.slide_files import read_slide_file
from vmamba2d.mil.data.tables import SlideEntry, read_label_csv, read_split_csv, read_survival_csv, select_split

STEP = 512


def _write_h5(path, features, coords, **attrs):
    with h5py.File(path, "w") as handle:
        handle["features"] = features
        handle["coords"] = coords
        for key, value in attrs.items():
            handle["coords"].attrs[key] = value


def _tissue(seed=0, height=6, width=9, keep=0.7, in_dim=4, step=STEP, origin=(3 * STEP, 5 * STEP)):
    """Random tissue cells of a height x width box, in shuffled file order: (features, pixel coords, cells)."""
    rng = np.random.default_rng(seed)
    cells = np.array([(c, r) for r in range(height) for c in range(width) if rng.random() < keep])
    cells = cells[rng.permutation(len(cells))]
    pixels = cells * step + np.array(origin)
    return rng.standard_normal((len(cells), in_dim)).astype(np.float32), pixels.astype(np.int64), cells


def test_placement_round_trip(tmp_path):
    features, pixels, cells = _tissue()
    _write_h5(tmp_path / "a.h5", features, pixels)
    raw = read_slide_file(tmp_path / "a.h5")
    kept, placement = prepare_slide(raw)
    assert torch.equal(kept, torch.from_numpy(features))
    shift = cells.min(axis=0)
    assert torch.equal(placement.coords, torch.from_numpy(cells - shift))
    assert placement.grid == (cells[:, 1].max() - shift[1] + 1, cells[:, 0].max() - shift[0] + 1)
    assert placement.step_px == (STEP, STEP)
    assert torch.equal(grid_to_pixels(placement.coords, placement.origin_px, placement.step_px), torch.from_numpy(pixels))


def test_pt_file_matches_h5(tmp_path):
    features, pixels, _ = _tissue(seed=1)
    _write_h5(tmp_path / "a.h5", features, pixels)
    torch.save({"features": torch.from_numpy(features), "coords": torch.from_numpy(pixels)}, tmp_path / "b.pt")
    a, b = prepare_slide(read_slide_file(tmp_path / "a.h5")), prepare_slide(read_slide_file(tmp_path / "b.pt"))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1].coords, b[1].coords) and a[1].grid == b[1].grid


def test_patch_step_sources(tmp_path):
    # Cells only at even columns: the GCD says 1024 px, CLAM attributes say 256 * 2 = 512 px.
    pixels = np.array([[0, 0], [1024, 0], [2048, 512]])
    features = np.ones((3, 2), np.float32)
    _write_h5(tmp_path / "gcd.h5", features, pixels)
    _write_h5(tmp_path / "attrs.h5", features, pixels, patch_size=256, patch_level=1, downsample=np.array([2.0, 2.0]))
    assert prepare_slide(read_slide_file(tmp_path / "gcd.h5"))[1].grid == (2, 3)
    assert prepare_slide(read_slide_file(tmp_path / "attrs.h5"))[1].grid == (2, 5)
    override = prepare_slide(read_slide_file(tmp_path / "gcd.h5"), GridOptions(patch_step=256))[1]
    assert override.grid == (3, 9) and override.step_px == (256, 256)
    assert infer_patch_step(torch.tensor([[7, 3]]), "one") == (1, 1)
    assert infer_patch_step(torch.tensor([[0, 0], [0, 300]]), "column") == (300, 300)


def test_irregular_coordinates_need_a_step():
    pixels = torch.tensor([[0, 0], [512, 0], [1024, 0], [1100, 512]])
    with pytest.raises(SlideDataError, match=r"slide 'odd'.*not on a regular grid.*GridOptions.patch_step"):
        infer_patch_step(pixels, "odd")


def test_duplicate_cells(tmp_path):
    features = np.arange(6, dtype=np.float32).reshape(3, 2)
    pixels = np.array([[0, 0], [512, 0], [600, 100]])  # the last patch floors into cell (1, 0)
    _write_h5(tmp_path / "dup.h5", features, pixels)
    raw = read_slide_file(tmp_path / "dup.h5")
    with pytest.raises(SlideDataError, match=r"slide 'dup'.*more than one patch.*col 1, row 0"):
        prepare_slide(raw, GridOptions(patch_step=512))
    mean_features, placement = prepare_slide(raw, GridOptions(patch_step=512, duplicates="mean"))
    assert torch.equal(placement.coords, torch.tensor([[0, 0], [1, 0]]))
    assert torch.equal(mean_features, torch.tensor([[0.0, 1.0], [3.0, 4.0]]))
    last_features, _ = prepare_slide(raw, GridOptions(patch_step=512, duplicates="last"))
    assert torch.equal(last_features, torch.tensor([[0.0, 1.0], [4.0, 5.0]]))


def test_absolute_placement():
    pixels = torch.tensor([[1024, 512], [1536, 1024]])
    placement = place_on_grid(pixels, step=512, placement="absolute")
    assert torch.equal(placement.coords, torch.tensor([[2, 1], [3, 2]])) and placement.grid == (3, 4)
    assert place_on_grid(pixels, step=512, placement="absolute", canvas_size=(10, 20)).grid == (10, 20)
    with pytest.raises(SlideDataError, match=r"slide 's'.*beyond the fixed canvas_size"):
        place_on_grid(pixels, slide_id="s", step=512, placement="absolute", canvas_size=(2, 20))


def test_pool_2x2_averages_occupied_cells():
    coords = torch.tensor([[0, 0], [1, 0], [1, 1], [2, 0], [3, 3]])
    features = torch.tensor([[1.0], [2.0], [6.0], [5.0], [7.0]])
    pooled, cells, grid = pool_2x2(features, coords)
    as_dict = {tuple(c.tolist()): float(f) for c, f in zip(cells, pooled)}
    assert as_dict == {(0, 0): 3.0, (1, 0): 5.0, (1, 1): 7.0} and grid == (2, 2)


def test_cap_pool_and_crop():
    coords = torch.tensor([(c, r) for r in range(10) for c in range(12) if (r < 3) or (c > 8)])
    raw_features = torch.randn(len(coords), 3)
    raw = dataclasses.replace(_raw(raw_features, coords * 512), slide_id="big")
    assert prepare_slide(raw, GridOptions(max_cells=30))[1].grid == (5, 6)  # 10x12 -> 5x6
    features, pooled = prepare_slide(raw, GridOptions(max_cells=29))
    assert pooled.grid == (3, 3) and pooled.step_px == (2048, 2048)  # 10x12 -> 5x6 -> 3x3
    _, best = prepare_slide(raw, GridOptions(max_cells=25, cap="crop"))
    assert best.grid[0] * best.grid[1] <= 25
    # The 5x5 window with most tissue: rows 0-4, cols 7-11 (3 full rows + 2 rows of cols 9-11 = 21).
    assert best.origin_px == (7 * 512, 0) and best.coords.shape[0] == 21
    windows = set()
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        _, random = prepare_slide(raw, GridOptions(max_cells=25, cap="crop"), generator=gen)
        assert random.grid[0] * random.grid[1] <= 25 and random.coords.shape[0] > 0
        windows.add(random.origin_px)
        again = prepare_slide(raw, GridOptions(max_cells=25, cap="crop"), generator=torch.Generator().manual_seed(seed))
        assert again[1].origin_px == random.origin_px
    assert len(windows) > 1


def _raw(features, coords_px):
    from vmamba2d.mil.data.slide_files import RawSlide

    return RawSlide("s", features, coords_px)


@pytest.mark.parametrize("features, coords, match", [
    (np.ones((3,), np.float32), np.zeros((3, 2)), r"features must be 2-D"),
    (np.ones((3, 4), np.float32), np.zeros((3, 3)), r"coords must have shape \(n, 2\)"),
    (np.ones((3, 4), np.float32), np.zeros((2, 2)), r"3 feature rows but 2 coords rows"),
    (np.ones((0, 4), np.float32), np.zeros((0, 2)), r"empty slide"),
    (np.array([[1.0, np.nan], [0.0, 0.0]], np.float32), np.array([[0, 0], [512, 0]]), r"NaN or infinite"),
    (np.ones((2, 4), np.int64), np.array([[0, 0], [512, 0]]), r"floating point"),
    (np.ones((2, 4), np.float32), np.array([[0.5, 0], [512, 0]]), r"integer pixel"),
    (np.ones((2, 4), np.float32), np.array([[-512, 0], [512, 0]]), r"negative"),
])
def test_bad_slide_files(tmp_path, features, coords, match):
    _write_h5(tmp_path / "bad.h5", features, coords)
    with pytest.raises(SlideDataError, match=rf"slide 'bad': .*{match}"):
        read_slide_file(tmp_path / "bad.h5")


def test_bad_file_kinds(tmp_path):
    with pytest.raises(FileNotFoundError, match="slide 'nope'"):
        read_slide_file(tmp_path / "nope.h5")
    with h5py.File(tmp_path / "nocoords.h5", "w") as handle:
        handle["features"] = np.ones((2, 3), np.float32)
    with pytest.raises(SlideDataError, match=r"slide 'nocoords'.*no dataset\(s\) \['coords'\]"):
        read_slide_file(tmp_path / "nocoords.h5")
    torch.save(torch.ones(3, 4), tmp_path / "bare.pt")
    with pytest.raises(SlideDataError, match=r"slide 'bare'.*bare feature tensor"):
        read_slide_file(tmp_path / "bare.pt")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(SlideDataError, match=r"slide 'junk'.*cannot read HDF5"):
        read_slide_file(tmp_path / "junk.h5")


def test_label_csv(tmp_path):
    path = tmp_path / "bracs.csv"
    path.write_text("slide_id,label,split\nA.svs,BT,train\nB,MT,val\nC,AT,Test\nD,BT,validation\n")
    entries, label_map = read_label_csv(path)
    assert label_map == {"AT": 0, "BT": 1, "MT": 2}
    assert [(e.slide_id, e.label, e.split) for e in entries] == [
        ("A", 1, "train"), ("B", 2, "val"), ("C", 0, "test"), ("D", 1, "val")]
    entries, _ = read_label_csv(path, label_map={"AT": 0, "BT": 1, "MT": 2})
    with pytest.raises(SlideDataError, match=r"line 3: slide 'B' has label 'MT', not in the label map"):
        read_label_csv(path, label_map={"AT": 0, "BT": 1})
    kept, _ = read_label_csv(path, label_map={"AT": 0, "BT": 1}, drop_unmapped=True)
    assert [e.slide_id for e in kept] == ["A", "C", "D"]
    numeric = tmp_path / "numeric.csv"
    numeric.write_text("slide_id,label\ns1,10\ns2,2\n")
    assert read_label_csv(numeric)[1] == {"2": 0, "10": 1}
    dhmc = tmp_path / "dhmc.csv"
    dhmc.write_text("File Name,Diagnosis,Slide Type,Data Split\nDHMC_1.png,Benign,x,Train\nDHMC_2.png,Clearcell,x,Val\n")
    entries, _ = read_label_csv(dhmc, label_map={"Benign": 0, "Clearcell": 2}, slide_column="File Name",
                                label_column="Diagnosis", split_column="Data Split")
    assert [(e.slide_id, e.label, e.split) for e in entries] == [("DHMC_1", 0, "train"), ("DHMC_2", 2, "val")]
    twice = tmp_path / "twice.csv"
    twice.write_text("slide_id,label\ns1,a\ns1,b\n")
    with pytest.raises(SlideDataError, match="listed twice"):
        read_label_csv(twice)
    with pytest.raises(SlideDataError, match=r"missing column\(s\) \['slide_id', 'label'\]"):
        read_label_csv(dhmc)


def test_survival_and_split_tables(tmp_path):
    surv = tmp_path / "UCEC.csv"
    surv.write_text(",case_id,slide_id,censorship,survival_months\n0,P1,s1a.svs,1,10.5\n1,P2,s2,0,3.0\n"
                    "2,P1,s1b,1,10.5\n")
    entries = read_survival_csv(surv)
    assert [(e.case_id, e.slide_id, e.slide_ids, e.time, e.censorship) for e in entries] == [
        ("P1", "s1a", ("s1a", "s1b"), 10.5, 1), ("P2", "s2", ("s2",), 3.0, 0)]
    bad = tmp_path / "bad.csv"
    bad.write_text("case_id,slide_id,censorship,survival_months\nP1,a,1,10\nP1,b,0,10\n")
    with pytest.raises(SlideDataError, match="case 'P1' has rows with different"):
        read_survival_csv(bad)
    bad.write_text("case_id,slide_id,censorship,survival_months\nP1,a,2,10\n")
    with pytest.raises(SlideDataError, match=r"line 2 \(case 'P1'\): censorship must be 0 or 1"):
        read_survival_csv(bad)
    splits = tmp_path / "splits_0.csv"
    splits.write_text(",train,val,test\n0,P1,P2,\n1,P3,P1,\n2,P3,,\n")
    assert read_split_csv(splits) == {"train": ["P1", "P3"], "val": ["P2", "P1"], "test": []}
    val = select_split(entries, read_split_csv(splits)["val"], by="case_id", exclude=["P1"])
    assert [e.case_id for e in val] == ["P2"]
    with pytest.raises(SlideDataError, match=r"1 split id\(s\) have no table entry"):
        select_split(entries, ["P1", "P9"], by="case_id")


def test_dataset_records_and_errors(tmp_path):
    features, pixels, cells = _tissue(seed=3, in_dim=6)
    _write_h5(tmp_path / "s1.h5", features, pixels)
    (tmp_path / "pt_files").mkdir()
    torch.save({"features": torch.from_numpy(features[::-1].copy()), "coords": torch.from_numpy(pixels[::-1].copy())},
               tmp_path / "pt_files" / "s2.pt")
    dataset = SlideDataset([SlideEntry("s1", label=1), SlideEntry("s2", label=0)], tmp_path, in_dim=6)
    first, second = dataset[0], dataset[1]
    assert first.features.dtype == torch.float32 and first.coords.dtype == torch.int64
    assert first.label == 1 and second.label == 0 and first.grid == second.grid
    # Shuffled file rows give the same model output (placement depends only on the coordinates).
    torch.manual_seed(0)
    model = MambaMIL2D(in_dim=6, num_classes=2, dim=8, d_state=2).eval()
    torch.testing.assert_close(model(first.features, first.coords)["logits"],
                               model(second.features, second.coords)["logits"], rtol=0, atol=1e-6)
    with pytest.raises(FileNotFoundError, match=r"1 slide\(s\) have no .h5 / .pt file.*'s3'"):
        SlideDataset([SlideEntry("s1", label=1), SlideEntry("s3", label=1)], tmp_path)
    with pytest.raises(SlideDataError, match=r"slide 's1': features have F=6, expected in_dim=5"):
        SlideDataset([SlideEntry("s1", label=1)], tmp_path, in_dim=5)[0]
    with pytest.raises(SlideDataError, match=r"have no label.*'s1'"):
        SlideDataset([SlideEntry("s1")], tmp_path)
    assert SlideDataset([SlideEntry("s1")], tmp_path, label_required=False)[0].label is None
    _write_h5(tmp_path / "s4.h5", np.full((2, 6), np.nan, np.float32), np.array([[0, 0], [512, 0]]))
    _write_h5(tmp_path / "s5.h5", np.ones((0, 6), np.float32), np.zeros((0, 2)))
    checked = SlideDataset([SlideEntry(s, label=0) for s in ("s1", "s4", "s2", "s5")], tmp_path)
    with pytest.raises(SlideDataError, match=r"(?s)2 of 4 slide\(s\) are unusable.*'s4'.*NaN.*'s5'.*empty"):
        checked.check_all()


def test_grid_options_validation():
    for kwargs, match in [(dict(placement="bbox"), "placement"), (dict(duplicates="first"), "duplicates"),
                          (dict(cap="resize"), "cap"), (dict(patch_step=0), "patch_step"),
                          (dict(canvas_size=(3, 4)), "placement='absolute'"), (dict(max_cells=0), "max_cells"),
                          (dict(placement="absolute", max_cells=10), "cannot be combined")]:
        with pytest.raises(ValueError, match=match):
            GridOptions(**kwargs)


def test_unusual_array_types(tmp_path):
    features, pixels, _ = _tissue(seed=3)
    _write_h5(tmp_path / "wide.h5", features, pixels.astype(np.uint16))  # CLAM may store uint coords
    np.testing.assert_array_equal(read_slide_file(tmp_path / "wide.h5").coords_px.numpy(), pixels)
    _write_h5(tmp_path / "text.h5", np.array([[b"a", b"b"]] * len(pixels)), pixels)
    with pytest.raises(SlideDataError, match=rf"slide 'text': {tmp_path / 'text.h5'}: features have unsupported type"):
        read_slide_file(tmp_path / "text.h5")
    torch.save({"features": torch.from_numpy(features), "coords": torch.from_numpy(pixels)}, tmp_path / "cut.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "cut.pt").read_bytes()[:100])
    with pytest.raises(SlideDataError, match=rf"slide 'cut': {tmp_path / 'cut.pt'}: cannot read the file \(truncated"):
        read_slide_file(tmp_path / "cut.pt")
