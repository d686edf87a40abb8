"""Slides (vmamba2d.mil.slides) on generated pyramidal TIFFs: reading with both backends, the pixel
size, Otsu's threshold, the tissue mask against the drawn blobs, the patch grid, the thumbnail and
bad input."""
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("openslide")
pytest.importorskip("tiffslide")

from vmamba2d.mil.slides import (PatchOptions, SlideError, TissueOptions, detect_tissue, draw_thumbnail,  # noqa: E402
                                 find_slides, open_slide, otsu_threshold, patch_grid)
from vmamba2d.mil.slides.patching import read_patch  # noqa: E402
from vmamba2d.mil.slides.synthetic import Blob, synthetic_slide_pixels, write_pyramid  # noqa: E402
from vmamba2d.mil.slides.synthetic import drawn_tissue  # noqa: E402
from vmamba2d.mil.slides.thumbnail import GRID, OUTLINE  # noqa: E402

SIZE = (1024, 768)
BLOBS = [Blob(300, 260, 200, 150, hole=(300, 260, 80, 60)), Blob(760, 480, 180, 220), Blob(900, 100, 8, 8)]
TISSUE = TissueOptions(seg_downsample=4, min_tissue_area=0.005, min_hole_area=0.001)


@pytest.fixture(scope="module")
def slide_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("slides")
    pixels = synthetic_slide_pixels(SIZE, BLOBS, seed=0)
    write_pyramid(root / "blobs.tif", pixels, mpp=0.5)
    return root / "blobs.tif", pixels


def _at_mask_resolution(drawn, mask):
    """The level-0 drawn tissue sampled at the centres of the mask's pixels."""
    height, width = mask.shape
    rows = ((np.arange(height) + 0.5) * drawn.shape[0] / height).astype(int)
    cols = ((np.arange(width) + 0.5) * drawn.shape[1] / width).astype(int)
    return drawn[rows][:, cols]


def _iou(a, b):
    return (a & b).sum() / (a | b).sum()


def test_otsu_against_a_brute_force_search():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(40, 10, 3000), rng.normal(160, 20, 1000)]).clip(0, 255).astype(np.uint8)
    best, best_t = -1.0, None
    for t in range(255):  # between-class variance of {v <= t} and {v > t}, from the values themselves
        low, high = values[values <= t].astype(float), values[values > t].astype(float)
        if len(low) and len(high):
            score = len(low) * len(high) * (low.mean() - high.mean()) ** 2
            if score > best * (1 + 1e-12):
                best, best_t = score, t
    found = int(otsu_threshold(values))  # ties (thresholds in an empty gap) may differ: compare the score
    low, high = values[values <= found].astype(float), values[values > found].astype(float)
    assert len(low) * len(high) * (low.mean() - high.mean()) ** 2 == pytest.approx(best, rel=1e-9)
    assert 60 < best_t <= found < 130
    assert otsu_threshold(np.full(100, 7, np.uint8)) == 0.0


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_both_backends_read_the_pyramid(slide_file, backend):
    path, pixels = slide_file
    with open_slide(path, backend=backend) as slide:
        assert slide.backend == backend and slide.slide_id == "blobs"
        assert slide.dimensions == SIZE and slide.mpp == pytest.approx(0.5)
        assert slide.level_downsamples == pytest.approx([1, 4, 16])
        np.testing.assert_array_equal(slide.read_region((100, 200), 0, (40, 30)), pixels[200:230, 100:140])
        assert slide.level_for_downsample(5.0) == 1 and slide.level_for_downsample(3.9) == 0
    assert open_slide(path).backend == "openslide"  # OpenSlide reads generic tiled TIFF


def test_pixel_size_from_the_user_or_an_error_naming_the_slide(tmp_path):
    write_pyramid(tmp_path / "nompp.tif", synthetic_slide_pixels((256, 256), [], seed=1), mpp=None, levels=1)
    with pytest.raises(SlideError, match=r"nompp.*no pixel size.*--slide-mpp"):
        open_slide(tmp_path / "nompp.tif")
    assert open_slide(tmp_path / "nompp.tif", mpp=0.25).mpp == 0.25
    (tmp_path / "broken.svs").write_bytes(b"II*\x00" + bytes(range(200)))
    with pytest.raises(SlideError, match="broken.svs: cannot be read"):
        open_slide(tmp_path / "broken.svs")
    with pytest.raises(SlideError, match="file not found"):
        open_slide(tmp_path / "missing.tif")
    with pytest.raises(ValueError, match="mpp must be a positive"):
        open_slide(tmp_path / "nompp.tif", mpp=-1.0)


def test_tissue_mask_matches_the_drawn_blobs(slide_file):
    path, _ = slide_file
    with open_slide(path, backend="tiffslide") as slide:
        tissue = detect_tissue(slide, TISSUE)
        assert tissue.level == 1 and tissue.mask.shape == (192, 256) and tissue.downsample == (4.0, 4.0)
        assert tissue.regions == 2  # the 16-px speck is below the minimum area
        drawn = _at_mask_resolution(drawn_tissue(SIZE, BLOBS[:2]), tissue.mask)
        assert _iou(tissue.mask, drawn) > 0.9
        for blob in BLOBS[:2]:  # each blob on its own
            one = _at_mask_resolution(drawn_tissue(SIZE, [blob]), tissue.mask)
            assert (tissue.mask & one).sum() / one.sum() > 0.9
        assert not tissue.mask[65, 75]  # the hole's centre (300, 260) / 4
        assert not tissue.mask[25, 225]  # the speck
        holes_filled = detect_tissue(slide, TissueOptions(seg_downsample=4, min_tissue_area=0.005, min_hole_area=1.0))
        assert holes_filled.mask[65, 75]
        low_res = detect_tissue(slide, TissueOptions(min_tissue_area=0.005, min_hole_area=0.001))
        assert low_res.level == 2 and _iou(low_res.mask, _at_mask_resolution(drawn_tissue(SIZE, BLOBS[:2]),
                                                                              low_res.mask)) > 0.8


def test_blank_slide_has_no_tissue(tmp_path):
    write_pyramid(tmp_path / "blank.tif", synthetic_slide_pixels((512, 512), [], seed=2), mpp=0.5)
    with open_slide(tmp_path / "blank.tif") as slide:
        tissue = detect_tissue(slide, TISSUE)
        assert not tissue.mask.any() and tissue.regions == 0
        assert len(patch_grid(slide, tissue, PatchOptions(patch_size=32, mpp=2.0)).coords) == 0


@pytest.mark.parametrize("mpp, step, level, read_size", [(2.0, 128, 1, 32), (1.0, 64, 0, 64), (None, 32, 0, 32)])
def test_patches_on_the_grid_inside_the_tissue(slide_file, mpp, step, level, read_size):
    path, pixels = slide_file
    options = PatchOptions(patch_size=32, mpp=mpp, magnification=20, tissue_fraction=0.5)
    drawn = drawn_tissue(SIZE, BLOBS[:2])
    with open_slide(path) as slide:
        grid = patch_grid(slide, detect_tissue(slide, TISSUE), options)
        assert (grid.step, grid.level, grid.read_size) == (step, level, read_size)
        coords = grid.coords
        assert len(coords) > 0 and np.all(coords % step == 0)
        assert np.all(coords[:, 0] + step <= SIZE[0]) and np.all(coords[:, 1] + step <= SIZE[1])
        fractions = {(x, y): drawn[y:y + step, x:x + step].mean() for y in range(0, SIZE[1] - step + 1, step)
                     for x in range(0, SIZE[0] - step + 1, step)}
        kept = set(map(tuple, coords.tolist()))
        assert all(fractions[c] >= 0.35 for c in kept)  # the mask is 4x coarser than level 0
        assert all(c in kept for c, f in fractions.items() if f >= 0.65)
        x, y = coords[len(coords) // 2]
        patch = grid.read_patch(slide, len(coords) // 2)
        assert patch.shape == (32, 32, 3)
        if level == 0:
            expected = Image.fromarray(pixels[y:y + step, x:x + step]).resize((32, 32), Image.BILINEAR)
            np.testing.assert_array_equal(patch, np.asarray(expected))
        else:  # level 1 holds the 4 x 4 block means of level 0
            blocks = pixels[y:y + step, x:x + step].reshape(32, 4, 32, 4, 3).mean(axis=(1, 3))
            np.testing.assert_array_equal(patch, np.round(blocks).astype(np.uint8))
        np.testing.assert_array_equal(read_patch(slide, coords[0], level, read_size, 32), grid.read_patch(slide, 0))


def test_thumbnail_shows_the_outline_and_the_grid(slide_file):
    path, _ = slide_file
    with open_slide(path) as slide:
        tissue = detect_tissue(slide, TISSUE)
        grid = patch_grid(slide, tissue, PatchOptions(patch_size=32, mpp=2.0))
        image = np.asarray(draw_thumbnail(slide, tissue, grid, max_side=512))
    assert image.shape == (384, 512, 3)
    assert (image == OUTLINE).all(axis=2).sum() > 100
    x, y = grid.coords[0] // 2  # level-0 -> thumbnail pixels
    assert tuple(image[y, x + 10]) == GRID


def test_find_slides_and_bad_options(tmp_path):
    (tmp_path / "a.svs").write_bytes(b"")
    (tmp_path / "b.tiff").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert [p.name for p in find_slides([tmp_path])] == ["a.svs", "b.tiff"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.tif").write_bytes(b"")
    with pytest.raises(ValueError, match="slide id 'a'"):
        find_slides([tmp_path, tmp_path / "sub" / "a.tif"])
    with pytest.raises(FileNotFoundError, match="nowhere"):
        find_slides([tmp_path / "nowhere"])
    with pytest.raises(ValueError, match="median_kernel"):
        TissueOptions(median_kernel=4)
    with pytest.raises(ValueError, match="tissue_fraction"):
        PatchOptions(tissue_fraction=1.5)
    with pytest.raises(ValueError, match="patch_size"):
        PatchOptions(patch_size=0)
