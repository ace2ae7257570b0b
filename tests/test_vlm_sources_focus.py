"""Source-photo validation on the packaged public-domain photos, and the resumable editing loop
(tiny stand-in editor) writing the FOCUS layout with pixel checks and regeneration."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.faces.detect import Face, make_detector
from biasaudit.params.execution import Execution
from biasaudit.params.vlm import Counterfactuals, Sources, ValidateEdits
from biasaudit.pipeline.engine import run_local
from biasaudit.pipeline.io import RecordLog
from biasaudit.vlm import focus, sources


class Boxes:
    """A detector stub returning fixed boxes (largest first), to test the dominance rule."""

    def __init__(self, *boxes):
        self.faces = [Face(b, 1.0) for b in boxes]

    def detect(self, rgb):
        return self.faces


def test_check_photo_reasons():
    p = Sources(min_side=100, min_face_side=40, dominance_ratio=4.0)
    rgb = np.zeros((200, 200, 3), np.uint8)
    assert sources.check_photo(None, Boxes(), p, "not an image")["reason"] == "not an image"
    assert "too small" in sources.check_photo(rgb[:50], Boxes(), p)["reason"]
    assert sources.check_photo(rgb, Boxes(), p)["reason"] == "no face detected"
    two = sources.check_photo(rgb, Boxes((0, 0, 60, 60), (100, 100, 150, 150)), p)
    assert two["status"] == "rejected" and "no dominant face" in two["reason"]
    dup = sources.check_photo(rgb, Boxes((0, 0, 60, 60), (2, 2, 58, 58)), p)  # same face twice
    assert dup["status"] == "ok" and dup["n_faces"] == 1
    small = sources.check_photo(rgb, Boxes((0, 0, 30, 30)), p)
    assert "face too small" in small["reason"]
    assert sources.check_photo(rgb, Boxes((0, 0, 80, 80), (150, 150, 170, 170)), p)["status"] == "ok"


def test_packaged_sources_are_real_faces():
    p = Sources(source="packaged", occupations=["doctor", "teacher"], photos_per_occupation=1, min_face_side=60,
                detector_upsample=0)
    cands = sources.packaged_candidates(p.occupations, p.photos_per_occupation, p.seed)
    assert [c["base_id"] for c in cands] == ["astronaut-0", "grace-hopper-0"]
    det = make_detector("dlib", dlib_upsample=0)
    assert all(sources.check_photo(c["rgb"], det, p)["status"] == "ok" for c in cands)
    crop = sources.seeded_crop(cands[0]["rgb"], 5)
    assert crop.shape == (460, 460, 3) and np.array_equal(crop, sources.seeded_crop(cands[0]["rgb"], 5))


def test_folder_candidates_keep_unreadable_files(tmp_path):
    (tmp_path / "nurse").mkdir()
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(tmp_path / "nurse" / "a b.png")
    (tmp_path / "nurse" / "broken.jpg").write_bytes(b"nope")
    cands = sources.folder_candidates(tmp_path, ["nurse", "cook"])
    assert [c["base_id"] for c in cands] == ["a-b", "broken"]
    (_, rec_a), (_, rec_b) = sources.select_sources(cands, Boxes(), Sources(min_side=32, photos_per_occupation=5))
    assert rec_b["status"] == "rejected" and rec_b["reason"] == "not an image"


def test_source_ids_are_unique_and_collisions_recorded():
    ids = sources.unique_ids(["p q.png", "p-q.png", "photo.jpg", "photo.png", "Photo.tif", "p-q-2.png"])
    assert [i for i, _ in ids] == ["p-q", "p-q-2", "photo", "photo-2", "Photo-3", "p-q-2-2"]
    assert len({i.lower() for i, _ in ids}) == len(ids)
    assert ids[0][1] == "" and "'p-q.png'" in ids[1][1] and "'p q.png'" in ids[1][1]
    assert "'photo.jpg'" in ids[3][1]


def test_rejected_photos_do_not_use_up_the_quota(tmp_path):
    (tmp_path / "cook").mkdir()
    for name, side in (("a.png", 50), ("b.png", 300), ("c.png", 300), ("d.png", 300)):
        Image.fromarray(np.full((side, side, 3), (200, 130, 100), np.uint8)).save(tmp_path / "cook" / name)
    p = Sources(min_side=100, min_face_side=40, photos_per_occupation=2)
    got = [(c["base_id"], r["status"]) for c, r in
           sources.select_sources(sources.folder_candidates(tmp_path, ["cook"]), Boxes((0, 0, 90, 90)), p)]
    assert got == [("a", "rejected"), ("b", "ok"), ("c", "ok"), ("d", "not_used")]


class Scored:
    def __init__(self, *faces, threshold=0.0):
        self.faces, self.threshold = [Face(b, s) for b, s in faces], threshold

    def detect(self, rgb):
        return self.faces


def test_dominance_weighs_detection_score_and_ignores_detections_below_threshold():
    p = Sources(min_side=100, min_face_side=40, dominance_ratio=4.0)
    rgb = np.zeros((300, 300, 3), np.uint8)
    face, shirt = (0, 0, 100, 100), (150, 150, 230, 230)  # a false detection 0.64× the face's area
    # area only: 10000 / 6400 = 1.6 < 4 → was rejected; area × score: 10000·1.2 / (6400·0.07) = 26.8
    weak = sources.check_photo(rgb, Scored((face, 1.2), (shirt, 0.07)), p)
    assert weak["status"] == "ok" and abs(weak["dominance"] - 10000 * 1.2 / (6400 * 0.07)) < 1e-9
    strong = sources.check_photo(rgb, Scored((face, 1.2), (shirt, 1.0)), p)  # a real second face
    assert strong["status"] == "rejected" and "no dominant face" in strong["reason"]
    below = sources.check_photo(rgb, Scored((face, 1.2), (shirt, 0.5), threshold=0.6), p)
    assert below["status"] == "ok" and below["n_faces"] == 1 and below["dominance"] is None
    # the strongest detection is the main face, not merely the largest
    big_weak = sources.check_photo(rgb, Scored(((0, 0, 200, 200), 0.01), (face, 1.5)), p)
    assert big_weak["det_score"] == 1.5 and big_weak["face_side"] == 100


@pytest.mark.slow
def test_editing_loop_resumes_and_regenerates(tmp_path):
    from skimage import data

    from biasaudit.backends.editors import EditResult, make_editor

    src_path = tmp_path / "src" / "doctor" / "astro.png"
    src_path.parent.mkdir(parents=True)
    Image.fromarray(data.astronaut()).save(src_path)
    srcs = pd.DataFrame([{"occupation": "doctor", "base_id": "astro", "path": str(src_path), "status": "ok"}])
    params = Counterfactuals(races=["Black", "White"], max_attempts=2)
    checks = ValidateEdits()
    items = focus.edit_items(srcs, params.races, params.genders)
    assert len(items) == 4

    tiny = make_editor(params)
    calls = []

    class FirstAttemptBlurs:  # attempt 1 blurs the whole photo (must fail the pixel checks), attempt 2 is clean
        name, model_id, revision, stand_in, uses_mask = "tiny", "tiny-face-recolour", "v1", True, True

        def settings(self):
            return {"first_attempt": "blurred"}

        def edit(self, reqs):
            out = tiny.edit(reqs)
            calls.append(reqs[0].seed)
            if len(calls) % 2 == 1:
                from scipy import ndimage
                out = [EditResult(ndimage.gaussian_filter(r.image, (2, 2, 0)), "ok") for r in out]
            return out

    log = RecordLog(tmp_path / "log.jsonl", "edit_id")
    fn = focus.make_edit_batch_fn(FirstAttemptBlurs(), params, checks, tmp_path / "focus")
    first = run_local(items[:2], fn, log, progress=False, execution=Execution())
    assert first.processed == 2
    again = run_local(items, fn, log, progress=False, execution=Execution())  # resumes: only the 2 remaining edits
    assert again.already_done == 2 and again.processed == 2
    rows = log.to_frame().set_index("edit_id")
    assert (rows["status"] == "ok").all() and (rows["attempt"] == 2).all()
    assert all(h.startswith("1:") and "ssim_outside" in h and h.endswith("2:pass") for h in rows["attempt_history"])
    assert len(set(calls)) == 8  # a fresh seed per attempt
    for edit_id, r in rows.iterrows():
        assert r["path"].endswith(edit_id.split("/")[-1] + ".jpg") and r["sha256"] and r["stand_in"]
    found, problems = focus.scan_focus(tmp_path / "focus")
    assert len(found) == 4 and not problems


def test_every_file_gets_a_row_gray_photos_are_rejected_and_conversions_recorded(tmp_path):
    """A .gif, a note, a subfolder, a file outside the occupation folders and one of an occupation not
    asked for each get a row with its reason; a gray photo (an L-mode PNG, and an RGB JPEG of R = G = B)
    is rejected for its lack of colour; CMYK, EXIF rotation and alpha are named in `conversion`."""
    colour = np.zeros((120, 80, 3), np.uint8)
    colour[..., 0], colour[..., 1], colour[..., 2] = 200, 120, np.arange(80, dtype=np.uint8)[None, :]
    cook = tmp_path / "cook"
    (cook / "sub").mkdir(parents=True)
    (cook / "sub" / "x.jpg").write_bytes(b"x")
    Image.fromarray(colour).save(cook / "anim.gif")
    (cook / "notes.txt").write_text("who took these")
    Image.fromarray(colour[..., 0]).save(cook / "gray.png")  # mode L
    Image.fromarray(np.repeat(colour[..., 1:2], 3, axis=2)).save(cook / "gray_rgb.jpg", quality=90)
    Image.fromarray(colour).convert("CMYK").save(cook / "cmyk.jpg", quality=95)
    rotated = Image.fromarray(colour)
    exif = rotated.getexif()
    exif[0x0112] = 6  # "rotate 90° clockwise to view"
    rotated.save(cook / "rotated.jpg", exif=exif.tobytes(), quality=95)
    rgba = np.dstack([colour, np.full(colour.shape[:2], 128, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(cook / "alpha.png")
    (tmp_path / "README.md").write_text("photos")
    (tmp_path / "janitor").mkdir()
    Image.fromarray(colour).save(tmp_path / "janitor" / "j.png")
    cands = sources.folder_candidates(tmp_path, ["cook"])
    got = {(c["occupation"], c["base_id"]): r for c, r in
           sources.select_sources(cands, Boxes((0, 0, 70, 70)), Sources(min_side=32, min_face_side=40,
                                                                        photos_per_occupation=10))}
    assert len(got) == 10  # every file under the folder (8 in cook/, 2 elsewhere), none left out
    assert "subfolder" in got[("cook", "x.jpg")]["reason"]
    skipped = {k: r["reason"] for k, r in got.items() if r["status"] == "skipped"}
    assert set(skipped) == {("cook", "anim.gif"), ("cook", "notes.txt"), ("cook", "x.jpg"), ("", "README.md"),
                            ("janitor", "j.png")}
    assert "'.gif'" in skipped[("cook", "anim.gif")] and "not a photo format" in skipped[("cook", "notes.txt")]
    assert "not in sources.occupations" in skipped[("janitor", "j.png")]
    assert "outside the occupation folders" in skipped[("", "README.md")]
    for gray in ("gray", "gray_rgb"):
        assert got[("cook", gray)]["status"] == "rejected" and "grayscale photo" in got[("cook", gray)]["reason"]
    assert "L→RGB" in got[("cook", "gray")]["reason"]
    assert got[("cook", "cmyk")]["status"] == "ok" and got[("cook", "cmyk")]["conversion"] == "CMYK→RGB"
    assert got[("cook", "rotated")]["conversion"] == "EXIF orientation 6 applied"
    assert (got[("cook", "rotated")]["width"], got[("cook", "rotated")]["height"]) == (120, 80)  # upright
    assert got[("cook", "alpha")]["conversion"] == "RGBA: alpha composited on white"


def test_links_loops_and_folders_named_like_photos_get_their_reason(tmp_path):
    """Real symlinks in the source folder: a dangling link, a two-link loop and a folder named `x.jpg` are
    each recorded as what they are, not as "not a photo format" (or not at all); a link to a photo is a photo."""
    cook = tmp_path / "cook"
    (cook / "x.jpg").mkdir(parents=True)
    colour = np.zeros((60, 60, 3), np.uint8)
    colour[..., 0] = 200
    Image.fromarray(colour).save(cook / "a.png")
    (cook / "alias.png").symlink_to("a.png")
    (cook / "dangling.jpg").symlink_to("deleted.jpg")
    (cook / "loop1.jpg").symlink_to("loop2.jpg")
    (cook / "loop2.jpg").symlink_to("loop1.jpg")
    (tmp_path / "stray.jpg").symlink_to(tmp_path / "gone")
    cands = sources.folder_candidates(tmp_path, ["cook"])
    reason = {(c["occupation"], c["base_id"]): c.get("skip", "") for c in cands}
    assert reason[("cook", "a")] == reason[("cook", "alias")] == ""  # both read as photos
    assert reason[("cook", "dangling.jpg")].startswith("broken link: 'dangling.jpg' → 'deleted.jpg'")
    assert reason[("cook", "loop1.jpg")].startswith("link loop")
    assert reason[("cook", "loop2.jpg")].startswith("link loop")
    assert reason[("cook", "x.jpg")].startswith("a directory, not a file")
    assert "outside the occupation folders" in reason[("", "stray.jpg")] and "broken link" in reason[("", "stray.jpg")]
    assert len(cands) == 7  # every entry, the empty folder x.jpg included, has exactly one row
    assert not any("not a photo format" in r for r in reason.values())


def test_scan_focus_names_links_loops_and_folders(tmp_path):
    base = tmp_path / "focus" / "cook" / "b1"
    base.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(focus.focus_path(tmp_path / "focus", "cook", "b1", "White", "man"))
    focus.focus_path(tmp_path / "focus", "cook", "b1", "Black", "man").symlink_to("missing.jpg")
    focus.focus_path(tmp_path / "focus", "cook", "b1", "Black", "woman").mkdir()
    (base / "null.jpg").symlink_to("original.jpg")
    (base / "original.jpg").symlink_to("null.jpg")
    (base / "notes").mkdir()  # a folder not named like an image: not part of the layout, not a problem
    found, problems = focus.scan_focus(tmp_path / "focus")
    assert found["group"].tolist() == ["WM"]
    why = {p.split(": ", 1)[0].rsplit("/", 1)[-1]: p.split(": ", 1)[1] for p in problems}
    assert set(why) == {"Black_man.jpg", "Black_woman.jpg", "null.jpg", "original.jpg"}
    assert why["Black_man.jpg"].startswith("broken link") and why["Black_woman.jpg"] == "a directory, not a file"
    assert why["null.jpg"].startswith("link loop") and why["original.jpg"].startswith("link loop")
