"""The embedded model's world (nodes/models/shapes.py): captions, the held-out split, and the
pixel-statistics check on pictures drawn from known scenes."""

import random

import numpy as np

from mixgraph.nodes.models import shapes as S


def test_shapes_check_reads_back_every_attribute_of_drawn_scenes():
    rng = random.Random(1)
    for _ in range(300):
        scene = S.random_scene(rng, held_out=rng.random() < 0.5)
        verdict = S.check_image(S.render(scene, rng))
        assert (verdict.color, verdict.background, verdict.shape, verdict.position) == \
            (scene.color, scene.background, scene.shape, scene.position), (scene, verdict)


def test_shapes_check_on_upscaled_float_pictures():
    scene = S.Scene("red", "triangle", "large", "at the top left", "blue")
    img = S.render(scene).astype(np.float32) / 255.0
    big = img.repeat(4, axis=0).repeat(4, axis=1)  # 256x256, as the demo saves it
    verdict = S.check_image(big)
    assert (verdict.color, verdict.background, verdict.shape) == ("red", "blue", "triangle")
    assert abs(verdict.fill - 0.5) < 0.06


def _gaussian_blur(img: np.ndarray, sigma: float) -> np.ndarray:
    n = img.shape[0]
    i = np.arange(n)
    g = np.exp(-0.5 * ((i[:, None] - i[None, :]) / sigma) ** 2)
    g /= g.sum(axis=1, keepdims=True)
    return np.einsum("ij,jkc,lk->ilc", g, img.astype(np.float32) / 255.0, g)


def test_shapes_check_reads_the_class_of_small_blurred_shapes():
    # a decoded picture's edges are soft: blurred by 1.5 px, a 16-pixel triangle fills its
    # bounding box like a circle, yet its blurred template still fits it best
    rng = random.Random(3)
    by_fill = 0
    for shape in ("circle", "square", "triangle"):
        for _ in range(8):
            scene = S.Scene(rng.choice(["red", "green", "yellow", "white"]), shape, "small",
                            rng.choice(list(S.POSITIONS)), "blue")
            verdict = S.check_image(_gaussian_blur(S.render(scene, rng), 1.5))
            assert (verdict.background, verdict.shape) == ("blue", shape), (scene, verdict)
            by_fill += verdict.shape_by_fill == shape
    assert by_fill < 24  # the fill-ratio reading misses some of them


def test_shapes_check_of_a_plain_picture_finds_no_shape():
    plain = np.zeros((64, 64, 3), np.uint8) + np.array(S.COLORS["green"], np.uint8)
    verdict = S.check_image(plain)
    assert verdict.background == "green" and verdict.shape is None and verdict.color is None


def test_shapes_caption_parses_back_and_uses_articles():
    scene = S.Scene("orange", "square", "small", "on the right", "white")
    text = S.caption(scene)
    assert text == "a small orange square on the right on a white background"
    assert S.parse_caption(text) == {"color": "orange", "shape": "square", "size": "small",
                                     "position": "on the right", "background": "white"}
    assert S.caption(scene, size=False, position=False) == "an orange square on a white background"
    assert S.parse_caption("a blue circle on a yellow background") == {
        "color": "blue", "shape": "circle", "background": "yellow"}


def test_shapes_held_out_split_is_a_fixed_tenth():
    held = S.held_out_scenes()
    total = len(S.all_scenes())
    assert 0.08 < len(held) / total < 0.12
    rng = random.Random(0)
    assert not any(S.is_held_out(S.random_scene(rng)) for _ in range(500))
    assert all(S.is_held_out(S.random_scene(rng, held_out=True)) for _ in range(50))
